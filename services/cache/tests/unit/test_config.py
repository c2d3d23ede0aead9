"""Settings from the environment: defaults, overrides and errors that name the variable."""

from __future__ import annotations

import pytest
import torch

from llm_cache.config import SemanticSettings, Settings
from llm_cache.encoder import fast_dtype
from llm_cache.server import encoder_dtype
from llm_common.config import ConfigError


def test_defaults() -> None:
    settings = Settings.from_env({})
    assert settings.server.grpc_port == 50055
    assert settings.server.metrics_port == 9155
    assert settings.semantic.threshold == 0.85
    assert settings.policy.default_ttl_s == 86_400
    assert settings.redis.key_prefix == "llmcache:"
    assert settings.semantic.encoder_dtype == "auto"
    assert settings.limits.max_recorded_hits == 4096
    assert (settings.feed.max_subscribers, settings.feed.max_pending) == (1024, 1024)


def test_overrides() -> None:
    settings = Settings.from_env(
        {
            "REDIS_URL": "redis://cache-redis:6379/2",
            "CACHE_SEMANTIC_THRESHOLD": "0.9",
            "CACHE_TENANT_BUDGET_BYTES": "16777216",
            "CACHE_SEMANTIC_GUARD": "false",
            "CACHE_ENCODER_DIR": "/models/minilm",
            "CACHE_ENCODER_DTYPE": "float32",
            "CACHE_MAX_RECORDED_HITS": "100",
            "CACHE_FEED_MAX_SUBSCRIBERS": "8",
            "CACHE_FEED_MAX_PENDING": "64",
        }
    )
    assert settings.redis.url == "redis://cache-redis:6379/2"
    assert settings.semantic.threshold == 0.9
    assert settings.policy.tenant_budget_bytes == 16 << 20
    assert not settings.semantic.guard
    assert str(settings.semantic.model_dir) == "/models/minilm"
    assert settings.semantic.encoder_dtype == "float32"
    assert settings.limits.max_recorded_hits == 100
    assert (settings.feed.max_subscribers, settings.feed.max_pending) == (8, 64)


@pytest.mark.parametrize(
    ("environ", "variable"),
    [
        ({"CACHE_SEMANTIC_THRESHOLD": "1.5"}, "CACHE_SEMANTIC_THRESHOLD"),
        ({"CACHE_SEMANTIC_THRESHOLD": "high"}, "CACHE_SEMANTIC_THRESHOLD"),
        ({"REDIS_URL": "http://x"}, "REDIS_URL"),
        ({"CACHE_KEY_PREFIX": "a{b}"}, "CACHE_KEY_PREFIX"),
        ({"CACHE_DEFAULT_TTL_S": "100", "CACHE_MAX_TTL_S": "10"}, "CACHE_DEFAULT_TTL_S"),
        ({"CACHE_TENANT_BUDGET_BYTES": "8192"}, "CACHE_MAX_ENTRY_BYTES"),
        ({"CACHE_SEMANTIC_CANDIDATES": "40", "CACHE_PREFILTER_KEEP": "16"},
         "CACHE_SEMANTIC_CANDIDATES"),
        ({"GRPC_PORT": "70000"}, "GRPC_PORT"),
        ({"CACHE_ENCODER_DTYPE": "int4"}, "CACHE_ENCODER_DTYPE"),
        ({"CACHE_FEED_MAX_SUBSCRIBERS": "0"}, "CACHE_FEED_MAX_SUBSCRIBERS"),
        ({"CACHE_FEED_MAX_PENDING": "4"}, "CACHE_FEED_MAX_PENDING"),
        ({"CACHE_MAX_RECORDED_HITS": "none"}, "CACHE_MAX_RECORDED_HITS"),
    ],
)  # fmt: skip
def test_bad_values_name_the_variable(environ: dict[str, str], variable: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.from_env(environ)
    assert caught.value.variable == variable


@pytest.mark.parametrize(
    ("name", "expected"),
    [("float32", torch.float32), ("bfloat16", torch.bfloat16), ("auto", fast_dtype())],
)
def test_encoder_dtype_names(name: str, expected: torch.dtype) -> None:
    assert encoder_dtype(SemanticSettings(encoder_dtype=name)) == expected
