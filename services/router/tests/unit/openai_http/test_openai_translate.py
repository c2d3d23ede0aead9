"""OpenAI request bodies -> LLMService requests, and the 400s for what cannot be honoured."""

from __future__ import annotations

from typing import Any

import pytest

from llm_router.api.openai_http import translate
from llm_router.api.openai_http.errors import OpenAIError
from llmapi.common.v1 import common_pb2
from llmapi.llm.v1 import llm_service_pb2 as pb


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "demo", "messages": [{"role": "user", "content": "hi"}], **fields}


def test_chat_maps_messages_roles_and_sampling() -> None:
    call = translate.chat_call(
        chat(
            messages=[
                {"role": "developer", "content": "be brief"},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
                {"role": "assistant", "content": "ok", "name": "bot"},
            ],
            temperature=0,
            top_p=0.5,
            top_k=40,
            max_tokens=7,
            stop="END",
            seed=-3,
            logprobs=True,
            user="u1",
            metadata={"team": "x"},
            cache={"bypass": True, "similarity_threshold": 0.9},
        )
    )
    request = pb.ChatRequest(**call.fields)
    assert [m.role for m in request.messages] == [
        common_pb2.ROLE_SYSTEM,
        common_pb2.ROLE_USER,
        common_pb2.ROLE_ASSISTANT,
    ]
    assert [m.content for m in request.messages] == ["be brief", "ab", "ok"]
    assert request.messages[2].name == "bot"
    s = request.sampling
    assert (s.temperature, s.top_p, s.top_k, s.max_tokens, s.seed) == (0.0, 0.5, 40, 7, -3)
    assert s.HasField("temperature")
    assert list(s.stop) == ["END"]
    assert s.logprobs
    assert (request.user, dict(request.metadata)) == ("u1", {"team": "x"})
    assert request.cache.bypass
    assert request.cache.similarity_threshold == pytest.approx(0.9)
    assert not call.stream


def test_unset_sampling_stays_unset_so_the_router_applies_its_defaults() -> None:
    s = pb.ChatRequest(**translate.chat_call(chat()).fields).sampling
    assert not s.HasField("temperature")
    assert not s.HasField("max_tokens")
    assert not s.HasField("seed")


def test_max_completion_tokens_wins_over_the_deprecated_max_tokens() -> None:
    call = translate.chat_call(chat(max_tokens=50, max_completion_tokens=5))
    assert pb.ChatRequest(**call.fields).sampling.max_tokens == 5


def test_stream_options_include_usage() -> None:
    call = translate.chat_call(chat(stream=True, stream_options={"include_usage": True}))
    assert call.stream
    assert call.include_usage
    pb.ChatStreamRequest(**call.fields)  # the same fields build the streaming request


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"model": ""}, "model"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content",
        ),
        ({"temperature": 2.5}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_p": True}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 2**31}, "max_tokens"),
        ({"seed": 2**63}, "seed"),
        ({"stop": [1, 2]}, "stop"),
        ({"n": 17}, "n"),
        ({"tools": [{"type": "function"}]}, "tools[0].function"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"logit_bias": {"a": 5}}, "logit_bias"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"metadata": {"k": 1}}, "metadata"),
        ({"cache": "yes"}, "cache"),
        ({"stream": "yes"}, "stream"),
    ],
)
def test_chat_rejects_with_the_offending_parameter(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(OpenAIError) as err:
        translate.chat_call(chat(**fields))
    assert err.value.status == 400
    assert err.value.param == param
    assert err.value.body()["error"]["type"] == "invalid_request_error"


def test_default_values_are_accepted() -> None:
    translate.chat_call(
        chat(n=1, presence_penalty=0, frequency_penalty=0.0, tools=[], logprobs=False)
    )


@pytest.mark.parametrize(
    ("prompt", "says"),
    [
        ([1, 2, 3], "token ids"),
        ([[1, 2], [3]], "token ids"),
        (["a", "b"], "only one prompt"),
        ([True, False], "only one prompt"),  # bools are no token ids
        ([[1], "b"], "only one prompt"),
    ],
)
def test_a_token_id_prompt_is_named_as_such(prompt: list[Any], says: str) -> None:
    with pytest.raises(OpenAIError) as err:
        translate.completion_call({"model": "demo", "prompt": prompt})
    assert err.value.status == 400
    assert err.value.param == "prompt"
    assert says in err.value.body()["error"]["message"]


def test_completion_takes_one_prompt() -> None:
    call = translate.completion_call(
        {"model": "demo", "prompt": ["Once"], "max_tokens": 3, "logprobs": 0}
    )
    request = pb.CompleteRequest(**call.fields)
    assert (request.prompt, request.sampling.max_tokens, request.sampling.logprobs) == (
        "Once",
        3,
        True,
    )


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"prompt": ""}, "prompt"),
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"prompt": [1, 2, 3]}, "prompt"),
        ({"prompt": "x", "echo": True}, "echo"),
        ({"prompt": "x", "suffix": "y"}, "suffix"),
        ({"prompt": "x", "best_of": 3}, "best_of"),
        ({"prompt": "x", "tools": [{"type": "function"}]}, "tools"),
    ],
)
def test_completion_rejects(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(OpenAIError) as err:
        translate.completion_call({"model": "demo", **fields})
    assert err.value.param == param


def test_embeddings_accept_a_string_or_a_list_and_base64() -> None:
    single = translate.embed_call({"model": "e", "input": "hello"})
    assert list(single.request.inputs) == ["hello"]
    assert not single.base64
    many = translate.embed_call({"model": "e", "input": ["a", "b"], "encoding_format": "base64"})
    assert list(many.request.inputs) == ["a", "b"]
    assert many.base64


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"input": []}, "input"),
        ({"input": [[1, 2]]}, "input"),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "x", "dimensions": 8}, "dimensions"),
        ({"input": "x", "model": 3}, "model"),
    ],
)
def test_embeddings_reject(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(OpenAIError) as err:
        translate.embed_call({"model": "e", **fields})
    assert err.value.param == param


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"{not json",
        b"[1, 2]",
        b"\xff\xfe",
        b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",  # deeper than json can recurse
        b'{"model": "m", "prompt": "\\ud800"}',  # a lone surrogate escape
        b'{"model": "m", "prompt": "\xed\xa0\x80"}',  # a raw surrogate (invalid UTF-8)
    ],
)
def test_bodies_that_are_not_a_json_object(body: bytes) -> None:
    with pytest.raises(OpenAIError) as err:
        translate.parse_body(body)
    assert err.value.status == 400
