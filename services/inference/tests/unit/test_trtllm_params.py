"""SamplingOptions -> tensorrt_llm SamplingParams / GuidedDecodingParams, and the outputs' top
logprobs -> TokenEvent, against the stand-in package (tests/fakes/tensorrt_llm), whose classes
have the real constructor signatures of NVIDIA/TensorRT-LLM `tensorrt_llm/sampling_params.py`
(commit a98a9061) and `executor/result.py` (commit a678b91a): a wrong field name or type fails.

Generated grammars and structural tags are checked with the xgrammar installed here (the
backend TensorRT-LLM compiles them with, guided_decoding_backend="xgrammar").
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest
import torch
import xgrammar
from xgrammar.testing import _is_grammar_accept_string

from llm_inference.backends.trtllm import TrtLlmBackend
from llm_inference.backends.trtllm_params import (
    MAX_TAGGED_ITEMS,
    checkpoint_vocab_size,
    choice_grammar,
    step_logprobs,
)
from llm_inference.engine.api import (
    FormatKind,
    InvalidRequest,
    OutputFormatSpec,
    SamplingOptions,
    TopToken,
)

from .trtllm_fake import (
    VOCAB,
    install_fake_tensorrt_llm,
    remove_fake_tensorrt_llm,
    trtllm_config,
    write_checkpoint,
)

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
ITEM = '{"city": "Oslo"}'


@pytest.fixture
def trt(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    yield install_fake_tensorrt_llm(monkeypatch)
    remove_fake_tensorrt_llm()


@pytest.fixture
def adapter(trt: ModuleType, tmp_path: Path) -> TrtLlmBackend:
    return TrtLlmBackend(trtllm_config(write_checkpoint(tmp_path)))


def fmt(kind: FormatKind, **fields: object) -> SamplingOptions:
    return SamplingOptions(output_format=OutputFormatSpec(kind, **fields))  # type: ignore[arg-type]


def invalid_field(adapter: TrtLlmBackend, options: SamplingOptions) -> str:
    with pytest.raises(InvalidRequest) as caught:
        adapter.sampling_params(options)
    return caught.value.field


def accepts(grammar: xgrammar.Grammar, text: str) -> bool:
    return bool(_is_grammar_accept_string(grammar, text))


def test_every_sampling_field_maps_to_its_sampling_params_field(
    adapter: TrtLlmBackend, trt: ModuleType
) -> None:
    options = SamplingOptions(
        temperature=0.7, top_p=0.9, top_k=4, max_tokens=12, seed=5, stop_token_ids=(3,),
        stop_strings=("w9",), ignore_eos=True, logprobs=True, detokenize=False, top_logprobs=5,
        presence_penalty=0.5, frequency_penalty=-0.25, repetition_penalty=1.2,
        logit_bias=((7, -100.0), (9, 2.5)), min_tokens=3, min_p=0.05,
    )  # fmt: skip
    params = adapter.sampling_params(options)
    assert isinstance(params, trt.SamplingParams)
    assert (params.temperature, params.top_p, params.top_k, params.min_p) == (0.7, 0.9, 4, 0.05)
    assert (params.max_tokens, params.seed, params.ignore_eos, params.min_tokens) == (
        12,
        5,
        True,
        3,
    )
    assert (params.stop, params.stop_token_ids, params.include_stop_str_in_output) == (
        ["w9"], [3], False,
    )  # fmt: skip
    assert params.detokenize is True  # stop strings are matched on text
    assert (params.presence_penalty, params.frequency_penalty) == (0.5, -0.25)
    assert params.repetition_penalty == 1.2
    assert params.logprobs == 5  # top_logprobs -> logprobs=N
    bias = params.embedding_bias
    assert (bias.dtype, tuple(bias.shape)) == (torch.float32, (VOCAB,))
    assert (bias[7].item(), bias[9].item(), float(bias.abs().sum())) == (-100.0, 2.5, 102.5)
    assert params.guided_decoding is None
    assert params.end_id is None  # set from the checkpoint's tokenizer by the LLM


def test_neutral_values_stay_runtime_defaults(adapter: TrtLlmBackend) -> None:
    params = adapter.sampling_params(SamplingOptions(detokenize=False))
    assert (params.top_k, params.min_p, params.min_tokens, params.seed) == (None,) * 4
    assert (params.stop, params.stop_token_ids, params.logprobs) == (None, None, None)
    penalties = (params.repetition_penalty, params.presence_penalty, params.frequency_penalty)
    assert penalties == (None, None, None)
    assert (params.embedding_bias, params.guided_decoding, params.detokenize) == (None, None, False)
    assert adapter.sampling_params(SamplingOptions(logprobs=True)).logprobs == 1


def test_the_stand_in_rejects_names_and_types_the_real_api_would_not_take(trt: ModuleType) -> None:
    with pytest.raises(TypeError):
        trt.SamplingParams(logit_bias={1: 2.0})  # not a field: TensorRT-LLM uses embedding_bias
    with pytest.raises(TypeError):
        trt.SamplingParams(embedding_bias=[0.0] * VOCAB)  # a float32 tensor, not a list
    with pytest.raises(TypeError):
        trt.llmapi.GuidedDecodingParams(json_schema="{}")  # the field is `json`
    with pytest.raises(ValueError, match="Only one guide"):
        trt.SamplingParams(guided_decoding=trt.llmapi.GuidedDecodingParams(regex="a", grammar="b"))


def test_logit_bias_outside_the_vocabulary_or_unknown_vocabulary_is_invalid(
    adapter: TrtLlmBackend, trt: ModuleType, tmp_path: Path
) -> None:
    for bias in ((VOCAB, 1.0), (-1, 1.0), (3, math.inf)):
        assert invalid_field(adapter, SamplingOptions(logit_bias=(bias,))) == "sampling.logit_bias"
    twice = adapter.sampling_params(SamplingOptions(logit_bias=((3, 1.0), (3, -2.0))))
    assert twice.embedding_bias[3].item() == -2.0  # the later entry wins
    bare = tmp_path / "bare"
    bare.mkdir()
    unknown = TrtLlmBackend(trtllm_config(bare))
    assert invalid_field(unknown, SamplingOptions(logit_bias=((1, 1.0),))) == "sampling.logit_bias"
    configured = TrtLlmBackend(trtllm_config(bare, vocab_size=8))
    assert (
        configured.sampling_params(SamplingOptions(logit_bias=((7, 1.0),))).embedding_bias[7] == 1
    )


def test_vocab_size_comes_from_the_checkpoint_config(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    for content, expected in (
        ({"vocab_size": 32000}, 32000),
        ({"text_config": {"vocab_size": 262144}}, 262144),  # multimodal HF checkpoints
        ({"pretrained_config": {"vocab_size": 128256}}, 128256),  # built engine directories
        ({"hidden_size": 8}, None),
        ([1, 2], None),
    ):
        config.write_text(json.dumps(content), encoding="utf-8")
        assert checkpoint_vocab_size(tmp_path) == expected
    assert checkpoint_vocab_size(tmp_path / "missing") is None


def test_json_object_schema_regex_and_grammar_map_to_their_guides(
    adapter: TrtLlmBackend, trt: ModuleType
) -> None:
    schema = json.dumps(SCHEMA)
    cases = {
        FormatKind.JSON_OBJECT: ({}, "json_object", True),
        FormatKind.JSON_SCHEMA: ({"spec": schema}, "json", schema),
        FormatKind.REGEX: ({"spec": "[a-z]+"}, "regex", "[a-z]+"),
        FormatKind.GRAMMAR: ({"spec": 'root ::= "yes" | "no"'}, "grammar", 'root ::= "yes" | "no"'),
    }
    for kind, (fields, name, value) in cases.items():
        guide = adapter.sampling_params(fmt(kind, **fields)).guided_decoding
        assert isinstance(guide, trt.llmapi.GuidedDecodingParams)
        assert getattr(guide, name) == value
        others = [f for f in ("json", "regex", "grammar", "structural_tag") if f != name]
        assert all(getattr(guide, f) is None for f in others)


def test_malformed_formats_are_invalid_with_their_field(adapter: TrtLlmBackend) -> None:
    cases = [
        (fmt(FormatKind.JSON_SCHEMA, spec="{not json"), "sampling.format.json_schema"),
        (fmt(FormatKind.JSON_SCHEMA, spec='"a string"'), "sampling.format.json_schema"),
        (fmt(FormatKind.REGEX), "sampling.format.regex"),
        (fmt(FormatKind.GRAMMAR), "sampling.format.grammar"),
        (fmt(FormatKind.CHOICE), "sampling.format.choice"),
        (fmt(FormatKind.CHOICE, choices=("a", "")), "sampling.format.choice"),
        (fmt(FormatKind.TAGGED_JSON, spec="[]"), "sampling.format.tagged_json.json_schema"),
        (
            fmt(FormatKind.TAGGED_JSON, spec="{}", max_items=MAX_TAGGED_ITEMS + 1),
            "sampling.format.tagged_json.max_items",
        ),
    ]
    for options, field in cases:
        assert invalid_field(adapter, options) == field


def test_formats_need_constrained_decoding_on_the_deployment(
    trt: ModuleType, tmp_path: Path
) -> None:
    config = trtllm_config(write_checkpoint(tmp_path), constrained_decoding=False)
    adapter = TrtLlmBackend(config)
    assert invalid_field(adapter, fmt(FormatKind.JSON_OBJECT)) == "sampling.format"
    assert adapter.sampling_params(SamplingOptions()).guided_decoding is None


def test_choice_is_an_ebnf_grammar_of_the_escaped_alternatives(adapter: TrtLlmBackend) -> None:
    choices = ('say "hi"', "back\\slash", "two\nlines", "tab\there", "été", "\x01", "yes")
    guide = adapter.sampling_params(fmt(FormatKind.CHOICE, choices=choices)).guided_decoding
    assert guide.grammar == choice_grammar(choices)
    grammar = xgrammar.Grammar.from_ebnf(guide.grammar)
    assert all(accepts(grammar, choice) for choice in choices)
    assert not any(accepts(grammar, text) for text in ("", "ye", "yess", 'say "hi', "tab"))
    assert choice_grammar(("a", "a", "b")) == 'root ::= "a" | "b"\n'  # duplicates once


def test_tagged_json_is_a_structural_tag_of_begin_schema_end(adapter: TrtLlmBackend) -> None:
    one = f"<tool_call>{ITEM}</tool_call>"
    options = fmt(
        FormatKind.TAGGED_JSON, spec=json.dumps(SCHEMA), begin="<tool_call>", end="</tool_call>"
    )
    guide = adapter.sampling_params(options).guided_decoding
    tag = json.loads(guide.structural_tag)  # a JSON string, as GuidedDecodingParams declares
    assert tag["type"] == "structural_tag"
    assert tag["format"] == {
        "type": "tag", "begin": "<tool_call>", "end": "</tool_call>",
        "content": {"type": "json_schema", "json_schema": SCHEMA},
    }  # fmt: skip
    grammar = xgrammar.Grammar.from_structural_tag(guide.structural_tag)
    assert accepts(grammar, one)
    for wrong in ("", ITEM, f"text {one}", one + one, '<tool_call>{"town": 1}</tool_call>'):
        assert not accepts(grammar, wrong)


@pytest.mark.parametrize("separator", [",\n", ""])
def test_tagged_json_repeats_up_to_max_items(adapter: TrtLlmBackend, separator: str) -> None:
    options = fmt(
        FormatKind.TAGGED_JSON, spec=json.dumps(SCHEMA), begin="<c>", end="</c>",
        separator=separator, max_items=3,
    )  # fmt: skip
    guide = adapter.sampling_params(options).guided_decoding
    grammar = xgrammar.Grammar.from_structural_tag(guide.structural_tag)
    item = f"<c>{ITEM}</c>"
    assert [accepts(grammar, separator.join([item] * n)) for n in range(5)] == [
        False, True, True, True, False,
    ]  # fmt: skip
    if separator:
        assert not accepts(grammar, item + item)
        assert not accepts(grammar, item + separator)


def test_step_logprobs_take_the_chosen_token_and_the_top_n_by_rank(trt: ModuleType) -> None:
    logprob = trt.Logprob
    top3_plus_sampled = {
        4: logprob(-0.1, 1),
        2: logprob(-1.0, 2),
        8: logprob(-2.0, 3),
        5: logprob(-6.0, 40),
    }  # the sampled token 5 is outside the top 3, as the PyTorch sampler reports it
    completion = SimpleNamespace(logprobs_diff=[top3_plus_sampled, {4: logprob(-0.2, 1)}])
    step = step_logprobs(completion, (5, 4), top_n=2)
    assert step.chosen == (-6.0, -0.2)
    assert step.top == ((TopToken(4, -0.1), TopToken(2, -1.0)), (TopToken(4, -0.2),))
    assert step_logprobs(completion, (5, 4), top_n=0).top is None
    unranked = SimpleNamespace(logprobs_diff=[{1: logprob(-3.0), 2: logprob(-0.5)}])
    assert step_logprobs(unranked, (1,), top_n=1).top == ((TopToken(2, -0.5),),)
    floats = SimpleNamespace(logprobs_diff=[-0.25])  # releases returning list[float]
    assert (step_logprobs(floats, (9,), 3).chosen, step_logprobs(floats, (9,), 3).top) == (
        (-0.25,), ((),),
    )  # fmt: skip
    missing = step_logprobs(SimpleNamespace(logprobs_diff=[{3: logprob(-1.0, 1)}]), (7,), 1)
    assert missing.chosen is not None
    assert math.isnan(missing.chosen[0])
    assert step_logprobs(SimpleNamespace(logprobs_diff=[]), (), 2).chosen is None
