"""n choices, tool calls and logprobs in answers and in streaming chunks."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llm_router.api.openai_http import chunks, responses
from llm_router.api.openai_http.errors import openai_param
from llmapi.common.v1 import common_pb2
from llmapi.llm.v1 import llm_service_pb2 as pb

USAGE = common_pb2.Usage(prompt_tokens=5, completion_tokens=6, total_tokens=11)
CALL = common_pb2.ToolCall(
    id="call_1",
    type="function",
    function=common_pb2.FunctionCall(name="get_weather", arguments='{"city":"Paris"}'),
)


def logprob(token: str, value: float, *tops: tuple[str, float]) -> common_pb2.TokenLogprob:
    return common_pb2.TokenLogprob(
        token=token,
        logprob=value,
        bytes=token.encode(),
        top_logprobs=[common_pb2.TopLogprob(token=t, logprob=v) for t, v in tops],
    )


def sse_events(data: bytes) -> list[dict[str, Any]]:
    """Every event in a run of server-sent events."""
    parts = [p for p in data.split(b"\n\n") if p]
    assert all(p.startswith(b"data: ") for p in parts)
    return [json.loads(p[len(b"data: ") :]) for p in parts]


def test_a_tool_call_answer_has_null_content_like_openai() -> None:
    reply = pb.ChatResponse(
        request_id="r",
        model="m",
        message=common_pb2.ChatMessage(role=common_pb2.ROLE_ASSISTANT, tool_calls=[CALL]),
        finish_reason=common_pb2.FINISH_REASON_TOOL_CALLS,
        usage=USAGE,
    )
    (choice,) = responses.chat_completion(reply)["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"] == {
        "role": "assistant",
        "content": None,
        "refusal": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
            }
        ],
    }


def test_text_and_calls_together_keep_the_text() -> None:
    message = common_pb2.ChatMessage(content="Checking.", tool_calls=[CALL])
    body = responses.chat_message(message)
    assert (body["content"], len(body["tool_calls"])) == ("Checking.", 1)
    assert "tool_calls" not in responses.chat_message(common_pb2.ChatMessage(content="hi"))


def test_n_choices_come_from_the_choices_field_in_index_order() -> None:
    reply = pb.ChatResponse(
        request_id="r",
        model="m",
        message=common_pb2.ChatMessage(content="zero"),
        finish_reason=common_pb2.FINISH_REASON_STOP,
        choices=[
            pb.ChatChoice(
                index=1,
                message=common_pb2.ChatMessage(content="one"),
                finish_reason=common_pb2.FINISH_REASON_LENGTH,
            ),
            pb.ChatChoice(
                index=0,
                message=common_pb2.ChatMessage(content="zero"),
                finish_reason=common_pb2.FINISH_REASON_STOP,
            ),
        ],
        usage=USAGE,
    )
    body = responses.chat_completion(reply)
    assert [(c["index"], c["message"]["content"], c["finish_reason"]) for c in body["choices"]] == [
        (0, "zero", "stop"),
        (1, "one", "length"),
    ]
    assert body["usage"]["total_tokens"] == 11


def test_chat_logprobs_with_bytes_and_alternatives() -> None:
    reply = pb.ChatResponse(
        message=common_pb2.ChatMessage(content="é"),
        logprobs=[
            logprob("é", -0.25, ("é", -0.25), ("e", -1.5)),
            common_pb2.TokenLogprob(token="\ufffd", logprob=-2.0, bytes=b"\xc3"),
        ],
    )
    (choice,) = responses.chat_completion(reply)["choices"]
    first, partial = choice["logprobs"]["content"]
    assert first == {
        "token": "é",
        "logprob": -0.25,
        "bytes": [0xC3, 0xA9],
        "top_logprobs": [
            {"token": "é", "logprob": -0.25, "bytes": [0xC3, 0xA9]},
            {"token": "e", "logprob": -1.5, "bytes": [0x65]},  # bytes from the text when absent
        ],
    }
    assert partial["bytes"] == [0xC3]  # a partial UTF-8 sequence stays raw


def test_text_completion_choices_and_legacy_logprobs() -> None:
    reply = pb.CompleteResponse(
        text="ab",
        choices=[
            pb.CompletionChoice(
                index=0,
                text="ab",
                finish_reason=common_pb2.FINISH_REASON_STOP,
                logprobs=[logprob("a", -0.5, ("a", -0.5), ("b", -1.0)), logprob("b", -0.25)],
            ),
            pb.CompletionChoice(index=1, text="c", finish_reason=common_pb2.FINISH_REASON_LENGTH),
        ],
    )
    first, second = responses.text_completion(reply)["choices"]
    assert first["logprobs"] == {
        "tokens": ["a", "b"],
        "token_logprobs": [-0.5, -0.25],
        "top_logprobs": [{"a": -0.5, "b": -1.0}, {}],
        "text_offset": [0, 1],
    }
    assert (second["index"], second["text"], second["logprobs"]) == (1, "c", None)
    plain = responses.text_completion(pb.CompleteResponse(text="x", logprobs=[logprob("x", -1)]))
    assert plain["choices"][0]["logprobs"]["top_logprobs"] is None


def test_streamed_tool_calls_as_openai_sends_them() -> None:
    maker = chunks.ChunkMaker(chat=True)
    opening = pb.ChatStreamResponse(request_id="r", model="m")
    messages = [
        pb.ChatStreamResponse(
            tool_calls=[common_pb2.ToolCallDelta(index=0, id="call_1", name="get_weather")]
        ),
        pb.ChatStreamResponse(tool_calls=[common_pb2.ToolCallDelta(index=0, arguments='{"ci')]),
        pb.ChatStreamResponse(
            tool_calls=[
                common_pb2.ToolCallDelta(index=0, arguments='ty":"Paris"}'),
                common_pb2.ToolCallDelta(index=1, id="call_2", name="now", arguments="{}"),
            ]
        ),
        pb.ChatStreamResponse(finish_reason=common_pb2.FINISH_REASON_TOOL_CALLS, usage=USAGE),
    ]
    data = maker.first(opening) + b"".join(maker.piece(m) for m in messages)
    events = sse_events(data)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    deltas = [e["choices"][0]["delta"] for e in events[1:]]
    assert deltas == [
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": ""},
                }
            ]
        },
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"ci'}}]},
        {
            "tool_calls": [
                {"index": 0, "function": {"arguments": 'ty":"Paris"}'}},
                {
                    "index": 1,
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "now", "arguments": "{}"},
                },
            ]
        },
        {},
    ]
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert sse_events(maker.usage_chunk())[0]["usage"]["total_tokens"] == 11


def test_streamed_choices_each_open_with_the_role_and_finish_on_their_own() -> None:
    maker = chunks.ChunkMaker(chat=True)
    first = pb.ChatStreamResponse(request_id="r", model="m", index=1, delta="B")
    messages = [
        first,
        pb.ChatStreamResponse(index=0, delta="A", logprobs=[logprob("A", -0.5)]),
        pb.ChatStreamResponse(index=1, finish_reason=common_pb2.FINISH_REASON_STOP),
        pb.ChatStreamResponse(index=0, finish_reason=common_pb2.FINISH_REASON_LENGTH),
    ]
    data = maker.first(first) + b"".join(maker.piece(m) for m in messages)
    choices = [e["choices"][0] for e in sse_events(data)]
    # Both choices open (in index order) before the first text, once each.
    assert [(c["index"], c["delta"]) for c in choices[:2]] == [
        (0, {"role": "assistant", "content": ""}),
        (1, {"role": "assistant", "content": ""}),
    ]
    assert [(c["index"], c["delta"], c["finish_reason"]) for c in choices[2:]] == [
        (1, {"content": "B"}, None),
        (0, {"content": "A"}, None),
        (1, {}, "stop"),
        (0, {}, "length"),
    ]
    assert choices[3]["logprobs"]["content"][0]["token"] == "A"


def test_streamed_completions_carry_the_index_and_per_choice_offsets() -> None:
    maker = chunks.ChunkMaker(chat=False)
    messages = [
        pb.CompleteStreamResponse(
            index=0, delta="ab", logprobs=[logprob("a", -1), logprob("b", -2)]
        ),
        pb.CompleteStreamResponse(index=1, delta="x", logprobs=[logprob("x", -3, ("x", -3))]),
        pb.CompleteStreamResponse(index=0, delta="c", logprobs=[logprob("c", -4)]),
        pb.CompleteStreamResponse(index=1, finish_reason=common_pb2.FINISH_REASON_STOP),
    ]
    assert maker.first(messages[0]) == b""
    choices = [sse_events(maker.piece(m))[0]["choices"][0] for m in messages]
    assert [(c["index"], c["text"]) for c in choices] == [(0, "ab"), (1, "x"), (0, "c"), (1, "")]
    assert choices[0]["logprobs"]["text_offset"] == [0, 1]
    assert choices[1]["logprobs"]["top_logprobs"] == [{"x": -3.0}]
    assert choices[2]["logprobs"]["text_offset"] == [2]
    assert choices[3]["finish_reason"] == "stop"


@pytest.mark.parametrize(
    ("path", "param"),
    [
        ("sampling.n", "n"),
        ("sampling.top_logprobs", "top_logprobs"),
        ("sampling.logit_bias[50256]", "logit_bias[50256]"),
        ("sampling.format.json_schema", "response_format.json_schema"),
        ("sampling.repetition_penalty", "repetition_penalty"),
        ("tool_choice.function_name", "tool_choice"),
        ("tools[2].function.parameters_json", "tools[2].function.parameters"),
        ("messages[1].tool_calls[0].id", "messages[1].tool_calls[0].id"),
    ],
)
def test_router_field_paths_name_the_openai_parameter(path: str, param: str) -> None:
    assert openai_param(path) == param
