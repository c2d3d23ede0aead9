"""Every validation error path of the public API: INVALID_ARGUMENT with field violations."""

from __future__ import annotations

import grpc
import pytest

from llm_common.errors import InvalidArgument
from llm_router.api.validation import (
    check_max_tokens,
    fits_context,
    validate_chat,
    validate_complete,
    validate_count,
    validate_embed,
)
from llm_router.config import Limits
from llm_router.requests import Kind
from llmapi.common.v1 import common_pb2
from llmapi.llm.v1 import llm_service_pb2 as pb

LIMITS = Limits(
    max_request_bytes=4096,
    max_messages=4,
    max_content_bytes=200,
    max_prompt_bytes=100,
    max_stop_strings=2,
    max_stop_bytes=8,
    max_stop_token_ids=2,
    max_top_k=50,
    max_metadata_pairs=2,
    max_metadata_key_bytes=8,
    max_metadata_value_bytes=8,
    max_user_bytes=8,
    max_embed_inputs=2,
    max_embed_input_bytes=10,
)


def user(text: str) -> common_pb2.ChatMessage:
    return common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content=text)


def chat(**kwargs: object) -> pb.ChatRequest:
    base: dict[str, object] = {"model": "demo", "messages": [user("hi")]}
    base.update(kwargs)
    return pb.ChatRequest(**base)  # type: ignore[arg-type]


def fields_of(exc: pytest.ExceptionInfo[InvalidArgument]) -> dict[str, str]:
    assert exc.value.code == grpc.StatusCode.INVALID_ARGUMENT
    return {v.field: v.description for v in exc.value.violations}


def test_valid_chat_becomes_a_generation_request() -> None:
    request = chat(
        sampling=common_pb2.SamplingParams(temperature=0.0, max_tokens=5, stop=["x"]),
        metadata={"k": "v"},
        request_id="abc-1",
    )
    parsed = validate_chat(request, LIMITS)
    assert parsed.kind is Kind.CHAT
    assert parsed.texts == ("hi",)
    assert parsed.sampling.max_tokens == 5
    assert parsed.deterministic
    assert parsed.request_id == "abc-1"
    assert parsed.fingerprint == request.SerializeToString(deterministic=True)


def test_stream_request_is_validated_the_same_way() -> None:
    parsed = validate_chat(pb.ChatStreamRequest(model="demo", messages=[user("x")]), LIMITS)
    assert parsed.messages[0].content == "x"
    assert not parsed.deterministic  # default temperature 1.0, no seed


@pytest.mark.parametrize(
    ("request_kwargs", "field"),
    [
        ({"model": ""}, "model"),
        ({"model": "m" * 200}, "model"),
        ({"messages": []}, "messages"),
        ({"messages": [user("a")] * 5}, "messages"),
        ({"messages": [common_pb2.ChatMessage(content="x")]}, "messages[0].role"),
        ({"messages": [common_pb2.ChatMessage(role=99, content="x")]}, "messages[0].role"),
        ({"messages": [user("")]}, "messages"),
        ({"messages": [user("a" * 150), user("b" * 60)]}, "messages"),
        (
            {"messages": [common_pb2.ChatMessage(role=2, content="x", name="n" * 70)]},
            "messages[0].name",
        ),
        ({"sampling": common_pb2.SamplingParams(temperature=2.5)}, "sampling.temperature"),
        ({"sampling": common_pb2.SamplingParams(temperature=-0.1)}, "sampling.temperature"),
        ({"sampling": common_pb2.SamplingParams(temperature=float("nan"))}, "sampling.temperature"),
        ({"sampling": common_pb2.SamplingParams(top_p=0.0)}, "sampling.top_p"),
        ({"sampling": common_pb2.SamplingParams(top_p=1.5)}, "sampling.top_p"),
        ({"sampling": common_pb2.SamplingParams(top_k=-1)}, "sampling.top_k"),
        ({"sampling": common_pb2.SamplingParams(top_k=51)}, "sampling.top_k"),
        ({"sampling": common_pb2.SamplingParams(max_tokens=0)}, "sampling.max_tokens"),
        ({"sampling": common_pb2.SamplingParams(max_tokens=-3)}, "sampling.max_tokens"),
        ({"sampling": common_pb2.SamplingParams(stop=["a", "b", "c"])}, "sampling.stop"),
        ({"sampling": common_pb2.SamplingParams(stop=["123456789"])}, "sampling.stop[0]"),
        ({"sampling": common_pb2.SamplingParams(stop=[""])}, "sampling.stop[0]"),
        (
            {"sampling": common_pb2.SamplingParams(stop_token_ids=[1, 2, 3])},
            "sampling.stop_token_ids",
        ),
        (
            {"sampling": common_pb2.SamplingParams(stop_token_ids=[-1])},
            "sampling.stop_token_ids[0]",
        ),
        ({"cache": pb.CachePolicy(similarity_threshold=0.0)}, "cache.similarity_threshold"),
        ({"cache": pb.CachePolicy(similarity_threshold=1.5)}, "cache.similarity_threshold"),
        ({"user": "u" * 9}, "user"),
        ({"metadata": {"a": "1", "b": "2", "c": "3"}}, "metadata"),
        ({"metadata": {"k" * 9: "v"}}, "metadata"),
        ({"metadata": {"k": "v" * 9}}, "metadata[k]"),
        ({"request_id": "has space"}, "request_id"),
        ({"request_id": "x" * 129}, "request_id"),
    ],
)
def test_chat_violations(request_kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidArgument) as exc:
        validate_chat(chat(**request_kwargs), LIMITS)
    assert field in fields_of(exc)


def test_oversized_request() -> None:
    big = Limits(max_request_bytes=64)
    with pytest.raises(InvalidArgument) as exc:
        validate_chat(chat(messages=[user("x" * 100)]), big)
    assert "request" in fields_of(exc)


def test_every_violation_is_reported_at_once() -> None:
    request = chat(
        model="",
        messages=[],
        sampling=common_pb2.SamplingParams(temperature=9, top_p=0, max_tokens=0),
    )
    with pytest.raises(InvalidArgument) as exc:
        validate_chat(request, LIMITS)
    assert set(fields_of(exc)) >= {
        "model",
        "messages",
        "sampling.temperature",
        "sampling.top_p",
        "sampling.max_tokens",
    }


def test_complete_needs_a_bounded_prompt() -> None:
    for prompt in ("", "p" * 101):
        with pytest.raises(InvalidArgument) as exc:
            validate_complete(pb.CompleteRequest(model="demo", prompt=prompt), LIMITS)
        assert "prompt" in fields_of(exc)
    parsed = validate_complete(pb.CompleteStreamRequest(model="demo", prompt="go"), LIMITS)
    assert parsed.kind is Kind.COMPLETION
    assert parsed.texts == ("go",)
    assert parsed.text_field(0) == "prompt"


def test_embed_validation() -> None:
    parsed = validate_embed(pb.EmbedRequest(model="e", inputs=["a", "b"]), LIMITS)
    assert parsed.normalize is True
    assert not validate_embed(
        pb.EmbedRequest(model="e", inputs=["a"], normalize=False), LIMITS
    ).normalize
    cases = [
        (pb.EmbedRequest(model="e"), "inputs"),
        (pb.EmbedRequest(model="e", inputs=["a", "b", "c"]), "inputs"),
        (pb.EmbedRequest(model="e", inputs=[""]), "inputs[0]"),
        (pb.EmbedRequest(model="e", inputs=["a", "x" * 11]), "inputs[1]"),
        (pb.EmbedRequest(model="", inputs=["a"]), "model"),
    ]
    for request, field in cases:
        with pytest.raises(InvalidArgument) as exc:
            validate_embed(request, LIMITS)
        assert field in fields_of(exc)


def test_count_tokens_needs_exactly_one_input() -> None:
    validate_count(pb.CountTokensRequest(model="m", prompt="x"), LIMITS)
    validate_count(pb.CountTokensRequest(model="m", messages=[user("x")]), LIMITS)
    for request in (
        pb.CountTokensRequest(model="m"),
        pb.CountTokensRequest(model="m", prompt="x", messages=[user("x")]),
    ):
        with pytest.raises(InvalidArgument) as exc:
            validate_count(request, LIMITS)
        assert "prompt" in fields_of(exc)


def test_max_tokens_against_the_context() -> None:
    unset = common_pb2.SamplingParams()
    assert check_max_tokens(unset, 10, 100, 256, prompt_field="prompt") == 90
    assert check_max_tokens(unset, 10, 1000, 256, prompt_field="prompt") == 256
    assert (
        check_max_tokens(common_pb2.SamplingParams(max_tokens=90), 10, 100, 5, prompt_field="p")
        == 90
    )
    with pytest.raises(InvalidArgument) as exc:
        check_max_tokens(common_pb2.SamplingParams(max_tokens=91), 10, 100, 5, prompt_field="p")
    assert "exceeds the model's context" in fields_of(exc)["sampling.max_tokens"]
    with pytest.raises(InvalidArgument) as exc:
        check_max_tokens(unset, 100, 100, 5, prompt_field="messages")
    assert "messages" in fields_of(exc)
    assert fits_context(unset, 10, 100, 90)
    assert not fits_context(unset, 10, 100, 91)
    assert not fits_context(common_pb2.SamplingParams(max_tokens=95), 10, 100, 1)
