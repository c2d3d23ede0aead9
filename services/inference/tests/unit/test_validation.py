"""GenerateRequest -> SamplingOptions mapping, and every validation error with its field."""

from __future__ import annotations

import math

import grpc
import pytest

from llm_common.errors import InvalidArgument
from llm_inference.config import Limits
from llm_inference.deployment import ModelFacts
from llm_inference.engine.api import SamplingOptions
from llm_inference.validation import embed_inputs, generate_input, watch_interval_s
from llmapi.common.v1 import common_pb2
from llmapi.inference.v1 import inference_service_pb2 as pb

FACTS = ModelFacts(vocab_size=100, max_context=64, default_max_tokens=16)
LIMITS = Limits(max_stop_strings=2, max_stop_string_bytes=8, max_stop_token_ids=3,
                max_embed_inputs=3, max_embed_text_bytes=10)  # fmt: skip


def request(**sampling: object) -> pb.GenerateRequest:
    prompt = sampling.pop("prompt", [1, 2, 3])
    return pb.GenerateRequest(
        request_id=str(sampling.pop("request_id", "req-1")),
        prompt_token_ids=prompt,  # type: ignore[arg-type]
        sampling=common_pb2.SamplingParams(**sampling),  # type: ignore[arg-type]
    )


def violations(req: pb.GenerateRequest) -> dict[str, str]:
    with pytest.raises(InvalidArgument) as err:
        generate_input(req, FACTS, LIMITS)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    return {v.field: v.description for v in err.value.violations}


def test_unset_fields_take_the_contract_defaults() -> None:
    given = generate_input(request(), FACTS, LIMITS)
    assert given.prompt_token_ids == (1, 2, 3)
    assert given.sampling == SamplingOptions(
        temperature=1.0, top_p=1.0, top_k=0, max_tokens=16, detokenize=False
    )
    assert not given.detokenize
    assert given.priority == 0


def test_default_max_tokens_is_capped_by_the_context() -> None:
    given = generate_input(request(prompt=list(range(60))), FACTS, LIMITS)
    assert given.sampling.max_tokens == 4


def test_every_field_maps() -> None:
    req = request(
        temperature=0.0, top_p=0.5, top_k=5, max_tokens=7, stop=["ab", "c"], seed=-3,
        ignore_eos=True, logprobs=True, stop_token_ids=[1, 99],
    )  # fmt: skip
    req.priority = 4
    req.detokenize = True
    given = generate_input(req, FACTS, LIMITS)
    assert given.sampling == SamplingOptions(
        temperature=0.0, top_p=0.5, top_k=5, max_tokens=7, seed=-3, stop_token_ids=(1, 99),
        stop_strings=("ab", "c"), ignore_eos=True, logprobs=True, detokenize=True,
    )  # fmt: skip
    assert (given.priority, given.detokenize) == (4, True)


def test_disable_speculation_opts_the_request_out() -> None:
    assert generate_input(request(), FACTS, LIMITS).sampling.speculative
    opted_out = generate_input(request(disable_speculation=True), FACTS, LIMITS)
    assert not opted_out.sampling.speculative


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"prompt": []}, "prompt_token_ids"),
        ({"prompt": list(range(64))}, "prompt_token_ids"),
        ({"prompt": [1, 100, 2]}, "prompt_token_ids[1]"),
        ({"prompt": [1, -1]}, "prompt_token_ids[1]"),
        ({"request_id": ""}, "request_id"),
        ({"request_id": "a b"}, "request_id"),
        ({"request_id": "x" * 129}, "request_id"),
        ({"temperature": -0.1}, "sampling.temperature"),
        ({"temperature": 2.5}, "sampling.temperature"),
        ({"temperature": math.nan}, "sampling.temperature"),
        ({"top_p": 0.0}, "sampling.top_p"),
        ({"top_p": 1.01}, "sampling.top_p"),
        ({"top_k": -1}, "sampling.top_k"),
        ({"top_k": 101}, "sampling.top_k"),
        ({"max_tokens": 0}, "sampling.max_tokens"),
        ({"max_tokens": 62}, "sampling.max_tokens"),
        ({"stop": ["a", "b", "c"]}, "sampling.stop"),
        ({"stop": ["123456789"]}, "sampling.stop[0]"),
        ({"stop": ["ok", ""]}, "sampling.stop[1]"),
        ({"stop_token_ids": [1, 2, 3, 4]}, "sampling.stop_token_ids"),
        ({"stop_token_ids": [1, 100]}, "sampling.stop_token_ids[1]"),
    ],
)
def test_violations_name_the_field(kwargs: dict[str, object], field: str) -> None:
    found = violations(request(**kwargs))
    assert list(found) == [field], found
    assert found[field]


def test_all_violations_are_reported_at_once() -> None:
    found = violations(request(prompt=[], temperature=3.0, top_k=-2, request_id=""))
    assert set(found) == {
        "request_id",
        "prompt_token_ids",
        "sampling.temperature",
        "sampling.top_k",
    }


def test_prompt_plus_max_tokens_may_fill_the_context_exactly() -> None:
    given = generate_input(request(prompt=list(range(60)), max_tokens=4), FACTS, LIMITS)
    assert given.sampling.max_tokens == 4


def test_embed_inputs() -> None:
    assert embed_inputs(pb.EmbedRequest(inputs=["a", "b"]), LIMITS) == ["a", "b"]
    for inputs, field in [([], "inputs"), (["a"] * 4, "inputs"), (["a", ""], "inputs[1]"),
                          (["x" * 11], "inputs[0]")]:  # fmt: skip
        with pytest.raises(InvalidArgument) as err:
            embed_inputs(pb.EmbedRequest(inputs=inputs), LIMITS)
        assert [v.field for v in err.value.violations] == [field]


def test_watch_interval() -> None:
    assert watch_interval_s(pb.WatchLoadRequest()) == 0.5
    assert watch_interval_s(pb.WatchLoadRequest(interval_ms=50)) == 0.05
    for bad in (-1, 49, 60_001):
        with pytest.raises(InvalidArgument) as err:
            watch_interval_s(pb.WatchLoadRequest(interval_ms=bad))
        assert [v.field for v in err.value.violations] == ["interval_ms"]
