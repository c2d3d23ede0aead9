"""The official `openai` client, unchanged, against the listener (and LLMService behind it)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import openai
import pytest

from .conftest import Listener, answer_words

pytestmark = pytest.mark.integration

PROMPT = "one two three four"
ANSWER = " ".join(answer_words(PROMPT))
IDENTITY = {
    "x-tenant-id": "acme",
    "x-key-id": "k1",
    "x-scopes": "completion:write",
    "x-request-id": "req-42",
}


_clients: list[openai.AsyncOpenAI] = []


@pytest.fixture(autouse=True)
async def _close_clients() -> AsyncIterator[None]:
    """Closes the test's clients on its own loop (an unclosed one is closed at garbage
    collection, on whatever loop is current then, or none)."""
    yield
    while _clients:
        await _clients.pop().close()


def client(listener: Listener) -> openai.AsyncOpenAI:
    api = openai.AsyncOpenAI(
        base_url=listener.base_url, api_key="unused-here", max_retries=0, timeout=10
    )
    _clients.append(api)
    return api


async def test_chat_completion(listener: Listener) -> None:
    reply = await client(listener).chat.completions.create(
        model="demo",
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": PROMPT}],
        max_tokens=9,
        temperature=0,
        extra_headers=IDENTITY,
    )
    assert reply.id == "chatcmpl-req-42"
    assert reply.choices[0].message.content == ANSWER
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage is not None
    assert (reply.usage.prompt_tokens, reply.usage.total_tokens) == (4, 8)
    request = listener.llm.seen.requests[-1]
    assert request.sampling.max_tokens == 9
    assert [m.content for m in request.messages] == ["be brief", PROMPT]


async def test_identity_headers_reach_the_service_as_metadata(listener: Listener) -> None:
    await client(listener).models.list(extra_headers={**IDENTITY, "x-llm-region": "eu"})
    seen = listener.llm.seen.metadata[-1]
    assert {k: seen[k] for k in IDENTITY} == IDENTITY
    assert seen["x-llm-region"] == "eu"


async def test_trace_context_is_continued(listener: Listener) -> None:
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    header = {"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"}
    await client(listener).models.list(extra_headers=header)
    forwarded = listener.llm.seen.metadata[-1]["traceparent"]
    assert forwarded.split("-")[1] == trace_id


async def test_chat_stream_with_usage(listener: Listener) -> None:
    stream = await client(listener).chat.completions.create(
        model="demo",
        messages=[{"role": "user", "content": PROMPT}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ANSWER
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finishes == ["stop"]
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 4


async def test_completions_unary_and_stream(listener: Listener) -> None:
    api = client(listener)
    reply = await api.completions.create(model="demo", prompt=PROMPT, max_tokens=4)
    assert reply.choices[0].text == ANSWER
    assert reply.choices[0].finish_reason == "length"
    stream = await api.completions.create(model="demo", prompt=PROMPT, stream=True)
    pieces = [chunk.choices[0].text async for chunk in stream]
    assert "".join(pieces) == ANSWER


async def test_embeddings_default_base64_and_float(listener: Listener) -> None:
    api = client(listener)
    texts = ["hello world", "abc"]
    by_default = await api.embeddings.create(model="enc", input=texts)  # the client asks for base64
    assert [d.embedding for d in by_default.data] == [[11.0, 0.0, 0.5], [3.0, 1.0, 0.5]]
    assert by_default.usage.prompt_tokens == 3
    floats = await api.embeddings.create(model="enc", input="xy", encoding_format="float")
    assert floats.data[0].embedding == [2.0, 0.0, 0.5]


async def test_models_list_and_retrieve(listener: Listener) -> None:
    api = client(listener)
    ids = [m.id async for m in api.models.list()]
    assert ids == ["demo-llama", "demo", "enc"]
    assert (await api.models.retrieve("demo")).id == "demo"
    with pytest.raises(openai.NotFoundError) as err:
        await api.models.retrieve("gpt-9")
    assert err.value.code == "model_not_found"


async def test_errors_arrive_as_the_client_s_exceptions(listener: Listener) -> None:
    api = client(listener)
    messages = [{"role": "user", "content": "x"}]
    with pytest.raises(openai.NotFoundError) as missing:
        await api.chat.completions.create(model="missing", messages=messages)  # type: ignore[arg-type]
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        await api.chat.completions.create(model="demo", messages=messages, max_tokens=5000)  # type: ignore[arg-type]
    assert bad.value.param == "max_tokens"
    with pytest.raises(openai.RateLimitError) as limited:
        await api.chat.completions.create(model="limited", messages=messages, stream=True)  # type: ignore[arg-type]
    assert limited.value.response.headers["retry-after"] == "4"
    with pytest.raises(openai.InternalServerError) as down:
        await api.embeddings.create(model="down", input="x")
    assert down.value.status_code == 503
    with pytest.raises(openai.BadRequestError) as local:
        await api.chat.completions.create(model="demo", messages=messages, n=17)  # type: ignore[arg-type]
    assert local.value.param == "n"


async def test_a_stream_that_breaks_midway_raises_in_the_client(listener: Listener) -> None:
    stream = await client(listener).chat.completions.create(
        model="breaks", messages=[{"role": "user", "content": PROMPT}], stream=True
    )
    received: list[str] = []

    async def consume() -> None:
        async for chunk in stream:
            received.extend(c.delta.content or "" for c in chunk.choices)

    with pytest.raises(openai.APIError, match="replica lost"):
        await consume()
    assert "".join(received) == " ".join(answer_words(PROMPT)[:2])


async def test_closing_the_stream_cancels_the_generation(listener: Listener) -> None:
    stream = await client(listener).chat.completions.create(
        model="endless", messages=[{"role": "user", "content": "go"}], stream=True
    )
    async for _ in stream:
        break
    await stream.close()
    await asyncio.wait_for(listener.llm.seen.cancelled.wait(), timeout=5)
