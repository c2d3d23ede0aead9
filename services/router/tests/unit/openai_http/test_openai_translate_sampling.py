"""Structured outputs, n, logprobs, penalties and logit_bias -> SamplingParams, and their 400s."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llm_router.api.openai_http import translate
from llm_router.api.openai_http.errors import OpenAIError
from llmapi.common.v1 import common_pb2
from llmapi.llm.v1 import llm_service_pb2 as pb

NESTED_SCHEMA = {
    "$defs": {
        "Step": {
            "properties": {"explanation": {"type": "string"}, "output": {"type": "string"}},
            "required": ["explanation", "output"],
            "type": "object",
            "additionalProperties": False,
        }
    },
    "properties": {
        "steps": {"items": {"$ref": "#/$defs/Step"}, "type": "array"},
        "final_answer": {"type": "string"},
    },
    "required": ["steps", "final_answer"],
    "type": "object",
    "additionalProperties": False,
}


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "demo", "messages": [{"role": "user", "content": "hi"}], **fields}


def chat_sampling(**fields: Any) -> common_pb2.SamplingParams:
    return pb.ChatRequest(**translate.chat_call(chat(**fields)).fields).sampling


def complete_sampling(**fields: Any) -> common_pb2.SamplingParams:
    call = translate.completion_call({"model": "demo", "prompt": "x", **fields})
    return pb.CompleteRequest(**call.fields).sampling


def rejected(fields: dict[str, Any], completion: bool = False) -> OpenAIError:
    call = translate.completion_call if completion else translate.chat_call
    body = {"model": "demo", "prompt": "x", **fields} if completion else chat(**fields)
    with pytest.raises(OpenAIError) as err:
        call(body)
    assert err.value.status == 400
    assert err.value.body()["error"]["type"] == "invalid_request_error"
    return err.value


def test_json_schema_travels_unchanged_as_json_text() -> None:
    s = chat_sampling(
        response_format={
            "type": "json_schema",
            "json_schema": {
                "name": "math_reasoning",
                "schema": NESTED_SCHEMA,
                "strict": True,
                "description": "steps",
            },
        }
    )
    assert s.format.WhichOneof("format") == "json_schema"
    assert json.loads(s.format.json_schema) == NESTED_SCHEMA
    # Key order (and so $defs before properties) is kept too.
    assert list(json.loads(s.format.json_schema)) == list(NESTED_SCHEMA)


def test_json_object_and_text_formats() -> None:
    assert chat_sampling(response_format={"type": "json_object"}).format.json_object
    assert not chat_sampling(response_format={"type": "text"}).HasField("format")
    assert not chat_sampling().HasField("format")
    # A json_schema without its schema: any JSON object.
    no_schema = {"type": "json_schema", "json_schema": {"name": "x"}}
    assert chat_sampling(response_format=no_schema).format.json_object


@pytest.mark.parametrize(
    ("fields", "oneof", "value"),
    [
        ({"guided_json": {"type": "object"}}, "json_schema", '{"type":"object"}'),
        ({"guided_json": '{"type": "object"}'}, "json_schema", '{"type":"object"}'),
        ({"guided_regex": "[0-9]+"}, "regex", "[0-9]+"),
        ({"guided_grammar": 'root ::= "a"'}, "grammar", 'root ::= "a"'),
        ({"structured_outputs": {"regex": "a|b"}}, "regex", "a|b"),
        ({"structured_outputs": {"json": {"type": "object"}}}, "json_schema", '{"type":"object"}'),
        ({"structured_outputs": {"json_object": True}}, "json_object", True),
    ],
)
def test_vllm_guided_decoding_extensions(fields: dict[str, Any], oneof: str, value: Any) -> None:
    s = chat_sampling(**fields)
    assert s.format.WhichOneof("format") == oneof
    assert getattr(s.format, oneof) == value


def test_guided_choice() -> None:
    s = chat_sampling(guided_choice=["yes", "no"])
    assert list(s.format.choice.values) == ["yes", "no"]


def test_completions_take_formats_too() -> None:
    assert complete_sampling(guided_regex="a+").format.regex == "a+"
    assert complete_sampling(response_format={"type": "json_object"}).format.json_object


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"response_format": "json"}, "response_format"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
            "response_format.json_schema.name",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "a b"}}},
            "response_format.json_schema.name",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": 1}}},
            "response_format.json_schema.schema",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "a", "schema": {}, "strict": "yes"},
                }
            },
            "response_format.json_schema.strict",
        ),
        ({"guided_json": "{not json"}, "guided_json"),
        ({"guided_json": [1]}, "guided_json"),
        ({"guided_regex": ""}, "guided_regex"),
        ({"guided_choice": []}, "guided_choice"),
        ({"guided_choice": ["a", 1]}, "guided_choice"),
        ({"guided_choice": ["x"] * 257}, "guided_choice"),
        ({"guided_grammar": 5}, "guided_grammar"),
        ({"guided_regex": "a", "guided_grammar": "b"}, "guided_grammar"),
        ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex"),
        ({"structured_outputs": {"regex": "a", "grammar": "b"}}, "structured_outputs"),
        ({"structured_outputs": {}}, "structured_outputs"),
        ({"structured_outputs": {"choice": "a"}}, "structured_outputs.choice"),
    ],
)
def test_bad_formats_name_the_parameter(fields: dict[str, Any], param: str) -> None:
    assert rejected(fields).param == param


def test_n_logprobs_penalties_and_vllm_extensions() -> None:
    s = chat_sampling(
        n=4,
        logprobs=True,
        top_logprobs=5,
        presence_penalty=0.5,
        frequency_penalty=-1.5,
        repetition_penalty=1.1,
        min_p=0.05,
        min_tokens=3,
        max_tokens=10,
        stop_token_ids=[7, 9],
        logit_bias={"50256": -100, "17": 2.5},
    )
    assert (s.n, s.logprobs, s.top_logprobs) == (4, True, 5)
    assert (s.presence_penalty, s.frequency_penalty) == (0.5, -1.5)
    assert s.repetition_penalty == pytest.approx(1.1)
    assert s.min_p == pytest.approx(0.05)
    assert (s.min_tokens, list(s.stop_token_ids)) == (3, [7, 9])
    assert dict(s.logit_bias) == {50256: -100.0, 17: 2.5}


def test_disable_speculation_reaches_the_sampling_params() -> None:
    assert chat_sampling(disable_speculation=True).disable_speculation
    assert complete_sampling(disable_speculation=True).disable_speculation
    assert not chat_sampling().disable_speculation
    assert rejected({"disable_speculation": "yes"}).body()["error"]["param"] == (
        "disable_speculation"
    )


def test_unset_extensions_stay_at_their_defaults() -> None:
    s = chat_sampling()
    assert (s.n, s.top_logprobs, s.min_tokens, s.min_p) == (0, 0, 0, 0.0)
    assert not s.HasField("repetition_penalty")
    assert not s.logit_bias


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 0}, "n"),
        ({"n": 17}, "n"),
        ({"n": 2.5}, "n"),
        ({"top_logprobs": 2}, "top_logprobs"),  # without logprobs, as at OpenAI
        ({"top_logprobs": 0}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"logprobs": 1}, "logprobs"),
        ({"presence_penalty": -2.1}, "presence_penalty"),
        ({"frequency_penalty": "much"}, "frequency_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"repetition_penalty": 2.5}, "repetition_penalty"),
        ({"min_p": 1.5}, "min_p"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"min_tokens": 5, "max_tokens": 4}, "min_tokens"),
        ({"stop_token_ids": ["1"]}, "stop_token_ids"),
        ({"logit_bias": [1]}, "logit_bias"),
        ({"logit_bias": {"abc": 1}}, "logit_bias"),
        ({"logit_bias": {"-1": 1}}, "logit_bias"),
        ({"logit_bias": {"1.5": 1}}, "logit_bias"),
        ({"logit_bias": {"99999999999": 1}}, "logit_bias"),
        ({"logit_bias": {"1": 101}}, "logit_bias"),
        ({"logit_bias": {"1": "x"}}, "logit_bias"),
        ({"logit_bias": {"1": True}}, "logit_bias"),
        ({"logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias"),
        ({"audio": {"voice": "alloy"}}, "audio"),
    ],
)
def test_bad_sampling_values_name_the_parameter(fields: dict[str, Any], param: str) -> None:
    assert rejected(fields).param == param


def test_logit_bias_errors_say_which_key() -> None:
    assert "'abc'" in rejected({"logit_bias": {"abc": 1}}).message
    assert "'7'" in rejected({"logit_bias": {"7": 200}}).message


def test_legacy_completion_n_best_of_and_logprobs() -> None:
    s = complete_sampling(n=3, best_of=3, logprobs=5, presence_penalty=1, logit_bias={"1": 1})
    assert (s.n, s.logprobs, s.top_logprobs, s.presence_penalty) == (3, True, 5, 1.0)
    assert dict(s.logit_bias) == {1: 1.0}
    assert complete_sampling(logprobs=0).logprobs
    assert not complete_sampling().logprobs
    assert complete_sampling(best_of=1).n == 0


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"best_of": 2}, "best_of"),
        ({"n": 2, "best_of": 3}, "best_of"),
        ({"n": 2, "best_of": 1}, "best_of"),
        ({"logprobs": 21}, "logprobs"),
        ({"logprobs": True}, "logprobs"),
        ({"n": 17}, "n"),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"functions": [{"name": "f"}]}, "functions"),
    ],
)
def test_legacy_completion_rejects(fields: dict[str, Any], param: str) -> None:
    assert rejected(fields, completion=True).param == param
