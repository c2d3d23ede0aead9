"""The sampling surface (n, top_logprobs, penalties, logit_bias, min_tokens, min_p): mapping to
SamplingOptions, service violations naming the field, and the engine's own checks."""

from __future__ import annotations

import math
from typing import Any

import grpc
import pytest

from llm_common.errors import InvalidArgument
from llm_inference.config import Limits
from llm_inference.deployment import ModelFacts
from llm_inference.engine.api import InvalidRequest, SamplingOptions
from llm_inference.engine.validation import validate_request
from llm_inference.service import _service_error
from llm_inference.validation import generate_input
from llmapi.common.v1 import common_pb2
from llmapi.inference.v1 import inference_service_pb2 as pb

FACTS = ModelFacts(vocab_size=100, max_context=64, default_max_tokens=16)


def request(**sampling: Any) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id="req-1",
        prompt_token_ids=[1, 2, 3],
        sampling=common_pb2.SamplingParams(**sampling),
    )


def violations(req: pb.GenerateRequest) -> dict[str, str]:
    with pytest.raises(InvalidArgument) as err:
        generate_input(req, FACTS, Limits())
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    return {v.field: v.description for v in err.value.violations}


def test_new_fields_map_to_sampling_options() -> None:
    req = request(
        n=1, top_logprobs=3, presence_penalty=0.5, frequency_penalty=-1.0,
        repetition_penalty=1.25, logit_bias={9: -100.0, 4: 2.5}, min_tokens=2, min_p=0.25,
        max_tokens=8,
    )  # fmt: skip
    sampling = generate_input(req, FACTS, Limits()).sampling
    assert sampling.top_logprobs == 3
    assert sampling.logprobs  # implied by top_logprobs
    assert (sampling.presence_penalty, sampling.frequency_penalty) == (0.5, -1.0)
    assert sampling.repetition_penalty == 1.25
    assert sampling.logit_bias == ((4, 2.5), (9, -100.0))
    assert (sampling.min_tokens, sampling.min_p) == (2, 0.25)


def test_unset_new_fields_are_off() -> None:
    sampling = generate_input(request(), FACTS, Limits()).sampling
    defaults = SamplingOptions()
    assert sampling.repetition_penalty == 1.0
    assert not sampling.logprobs
    for name in ("top_logprobs", "presence_penalty", "frequency_penalty", "logit_bias",
                 "min_tokens", "min_p", "output_format"):  # fmt: skip
        assert getattr(sampling, name) == getattr(defaults, name), name


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"n": 2}, "sampling.n"),
        ({"n": -1}, "sampling.n"),
        ({"top_logprobs": 21}, "sampling.top_logprobs"),
        ({"top_logprobs": -1}, "sampling.top_logprobs"),
        ({"presence_penalty": 2.5}, "sampling.presence_penalty"),
        ({"presence_penalty": math.nan}, "sampling.presence_penalty"),
        ({"frequency_penalty": -2.01}, "sampling.frequency_penalty"),
        ({"repetition_penalty": 0.0}, "sampling.repetition_penalty"),
        ({"repetition_penalty": 2.5}, "sampling.repetition_penalty"),
        ({"repetition_penalty": -1.0}, "sampling.repetition_penalty"),
        ({"logit_bias": {100: 1.0}}, "sampling.logit_bias[100]"),
        ({"logit_bias": {-1: 1.0}}, "sampling.logit_bias[-1]"),
        ({"logit_bias": {5: 100.5}}, "sampling.logit_bias[5]"),
        ({"logit_bias": {5: math.inf}}, "sampling.logit_bias[5]"),
        ({"logit_bias": {i: 1.0 for i in range(301)}}, "sampling.logit_bias"),
        ({"min_tokens": -1}, "sampling.min_tokens"),
        ({"min_tokens": 6, "max_tokens": 5}, "sampling.min_tokens"),
        ({"min_tokens": 17}, "sampling.min_tokens"),  # above the default max_tokens (16)
        ({"min_p": 1.5}, "sampling.min_p"),
        ({"min_p": -0.1}, "sampling.min_p"),
    ],
)
def test_each_bad_field_is_named(kwargs: dict[str, Any], field: str) -> None:
    assert list(violations(request(**kwargs))) == [field]


def test_all_sampling_violations_are_reported_at_once() -> None:
    found = violations(request(n=3, top_logprobs=50, min_p=2.0, logit_bias={200: 0.0}))
    assert set(found) == {
        "sampling.n",
        "sampling.top_logprobs",
        "sampling.min_p",
        "sampling.logit_bias[200]",
    }
    assert "router" in found["sampling.n"]


def _engine_check(**sampling: Any) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as err:
        validate_request(
            "r", [1, 2], SamplingOptions(**sampling),
            vocab_size=100, max_context=64, has_tokenizer=True,
        )  # fmt: skip
    return err.value


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"top_logprobs": 21}, "sampling.top_logprobs"),
        ({"presence_penalty": -3.0}, "sampling.presence_penalty"),
        ({"frequency_penalty": math.nan}, "sampling.frequency_penalty"),
        ({"repetition_penalty": 0.0}, "sampling.repetition_penalty"),
        ({"logit_bias": ((100, 1.0),)}, "sampling.logit_bias"),
        ({"logit_bias": ((1, -101.0),)}, "sampling.logit_bias"),
        ({"logit_bias": tuple((i, 1.0) for i in range(301))}, "sampling.logit_bias"),
        ({"min_tokens": 9, "max_tokens": 8}, "sampling.min_tokens"),
        ({"min_tokens": -1}, "sampling.min_tokens"),
        ({"min_p": 1.01}, "sampling.min_p"),
        ({"temperature": -1.0}, "sampling.temperature"),
    ],
)
def test_engine_rejects_bad_sampling_naming_the_field(kwargs: dict[str, Any], field: str) -> None:
    assert _engine_check(**kwargs).field == field


def test_engine_field_becomes_the_violation_field() -> None:
    error = _service_error("r", _engine_check(min_p=2.0))
    assert isinstance(error, InvalidArgument)
    assert [(v.field, v.description) for v in error.violations] == [
        ("sampling.min_p", "min_p must be in [0, 1]")
    ]
    unnamed = _service_error("r", InvalidRequest("prompt too long"))
    assert isinstance(unnamed, InvalidArgument)
    assert [v.field for v in unnamed.violations] == ["prompt_token_ids"]
