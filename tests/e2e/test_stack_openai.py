"""The official `openai` client, unchanged, through the edge (ext_authz, rate limits, router)."""

from __future__ import annotations

import json
import socket
import threading
import time

import openai
import pytest

from .conftest import RunningStack

pytestmark = pytest.mark.e2e


def client(stack: RunningStack, key: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=stack.endpoints.openai_base_url, api_key=key, max_retries=0, timeout=60
    )


def test_chat_completion(stack: RunningStack) -> None:
    reply = client(stack, stack.demo_key).chat.completions.create(
        model="demo", messages=[{"role": "user", "content": "Hello"}], max_tokens=5, temperature=0
    )
    assert reply.object == "chat.completion"
    assert reply.model == "demo-llama"
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage is not None
    assert 0 < reply.usage.completion_tokens <= 5


def test_chat_completion_stream(stack: RunningStack) -> None:
    stream = client(stack, stack.demo_key).chat.completions.create(
        model="demo",
        messages=[{"role": "user", "content": "Tell me a story"}],
        max_tokens=6,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert len(finishes) == 1
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens <= 6


def test_completion_and_models(stack: RunningStack) -> None:
    api = client(stack, stack.demo_key)
    reply = api.completions.create(model="demo", prompt="Once upon a time", max_tokens=3)
    assert reply.usage is not None
    assert reply.usage.completion_tokens <= 3
    assert "demo" in [m.id for m in api.models.list()]


def test_bad_key_is_an_authentication_error(stack: RunningStack) -> None:
    with pytest.raises(openai.AuthenticationError):
        client(stack, "sk-not-a-key").models.list()


def test_unknown_model_is_not_found(stack: RunningStack) -> None:
    with pytest.raises(openai.NotFoundError) as err:
        client(stack, stack.demo_key).chat.completions.create(
            model="no-such-model", messages=[{"role": "user", "content": "x"}]
        )
    assert err.value.code == "model_not_found"


def embedding_model() -> str | None:
    from llm_common.models_config import load_catalog

    from .conftest import REPO

    catalog = load_catalog(REPO / "infra" / "config" / "models.yaml", REPO / ".cache" / "models")
    return next((m.name for m in catalog.models.values() if m.kind == "embedding"), None)


def test_embeddings(stack: RunningStack) -> None:
    model = embedding_model()
    if model is None:
        pytest.skip("the catalogue lists no embedding model")
    reply = client(stack, stack.demo_key).embeddings.create(
        model=model, input=["hello world", "a cat"]
    )
    assert [d.index for d in reply.data] == [0, 1]
    vectors = [d.embedding for d in reply.data]
    assert len(vectors[0]) == len(vectors[1]) > 0
    assert sum(v * v for v in vectors[0]) == pytest.approx(1.0, abs=1e-3)  # unit length
    assert reply.usage.prompt_tokens > 0


def _hang_up_mid_stream(stack: RunningStack, i: int) -> None:
    """Start a streamed completion and close the connection after its first bytes."""
    body = json.dumps(
        {
            "model": "demo",
            "stream": True,
            "max_tokens": 300,
            "messages": [{"role": "user", "content": f"Hang up on me {i}"}],
        }
    ).encode()
    host, port = stack.edge.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: edge\r\n"
            + f"Authorization: Bearer {stack.demo_key}\r\n".encode()
            + b"Content-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        sock.recv(64 + 97 * (i % 4))  # hang up at different points of the stream


def test_clients_hanging_up_mid_stream_log_no_error(stack: RunningStack) -> None:
    """Regression: a stream cancelled while the router was writing was closed later by the
    garbage collector, in another context, where restoring the router's own deadline (these
    streams carry none) raised: "Task exception was never retrieved" at ERROR, about one
    hang-up in ten."""
    log = stack.endpoints.ca_cert.parents[2] / "logs" / "router.log"
    start = log.stat().st_size
    hang_ups = [threading.Thread(target=_hang_up_mid_stream, args=(stack, i)) for i in range(40)]
    for thread in hang_ups:
        thread.start()
    for thread in hang_ups:
        thread.join()
    time.sleep(3)  # the collector's finalizers run on the router's loop
    with log.open("rb") as lines:
        lines.seek(start)
        written = lines.read().decode()
    errors = [line for line in written.splitlines() if '"level": "error"' in line]
    assert not errors, errors[:3]
