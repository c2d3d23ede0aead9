"""SamplingOptions -> `tensorrt_llm.SamplingParams`, and streamed logprobs -> TokenEvent fields.

Every TensorRT-LLM name used here was checked against NVIDIA/TensorRT-LLM:

- `tensorrt_llm/sampling_params.py` (commit a98a9061; also 000a01de, 1.0.0rc4): SamplingParams is a
  kw-only dataclass with `min_tokens`, `min_p`, `repetition_penalty`, `presence_penalty`,
  `frequency_penalty` (None = runtime default), `logprobs` (int: log probabilities per output
  token), `embedding_bias` ("kFP32, shape [vocab_size]"; there is no `logit_bias` field) and
  `guided_decoding: GuidedDecodingParams(json, regex, grammar, json_object, structural_tag)`,
  exported by `tensorrt_llm/llmapi/__init__.py`.
- `tensorrt_llm/serve/openai_protocol.py` (commit 0076e939): trtllm-serve maps OpenAI
  `logit_bias` to `embedding_bias=torch.zeros(vocab_size, float32)` with the biases set.
- `tensorrt_llm/_torch/pyexecutor/grammar_matcher.py` (commit 0fccc5b9): a structural tag is
  handed as-is to xgrammar's `GrammarCompiler.compile_structural_tag`, i.e. xgrammar's
  `{"type": "structural_tag", "format": ...}` schema (xgrammar==0.1.25 in `requirements.txt`,
  commit 000867d9; the formats used below exist in xgrammar v0.1.25 `cpp/structural_tag.cc`).
- `tensorrt_llm/llmapi/llm.py` (main after PR #12362, in v1.3.0rc23+): `generate_async(...,
  priority: float = DEFAULT_REQUEST_PRIORITY)`, 0.5, validated to [0, 1], higher first; the
  PyTorch executor honours it with the PRIORITY waiting queue and ignores it under FCFS.
- `tensorrt_llm/executor/result.py` (commit a678b91a): `Logprob(logprob, rank)`;
  `CompletionOutput.logprobs_diff` is `list[dict[token_id, Logprob]]` (PyTorch backend) or
  `list[float]`; the PyTorch sampler puts the top-k (ranks 1..k) in each dict, plus the sampled
  token with a rank > k when it is not among them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from llm_inference.engine.api import (
    FormatKind,
    InvalidRequest,
    OutputFormatSpec,
    SamplingOptions,
    TopToken,
)

if TYPE_CHECKING:
    import torch

# Each extra item adds two copies of the tagged schema to the structural tag (see _repeated).
MAX_TAGGED_ITEMS = 16
FORMAT_FIELD = "sampling.format"
LOGIT_BIAS_FIELD = "sampling.logit_bias"
TAGGED_FIELD = "sampling.format.tagged_json"
PRIORITY_SCALE = 4.0  # our priority steps per e-fold of the logistic odds

TopLogprobs = tuple[tuple[TopToken, ...], ...]


@dataclass(frozen=True, slots=True)
class MappingContext:
    """What the mapping needs to know about the deployment."""

    vocab_size: int | None  # logits width (embedding_bias length); None = unknown
    constrained_decoding: bool  # the LLM was built with guided_decoding_backend="xgrammar"


def trt_priority(priority: int) -> float:
    """Our priority (any int32, higher first, 0 = default) as TensorRT-LLM's float in [0, 1]
    (higher first, 0.5 = default): a logistic curve, so the order is kept, 0 maps to 0.5 and
    the small values callers use (-8..8) stay well apart."""
    return 1.0 / (1.0 + math.exp(-max(min(priority, 400), -400) / PRIORITY_SCALE))


def build_sampling_params(
    trt: ModuleType, llmapi: ModuleType, sampling: SamplingOptions, context: MappingContext
) -> Any:
    """`tensorrt_llm.SamplingParams` for `sampling`; InvalidRequest(field=...) if it can't be."""
    return trt.SamplingParams(
        **_basic(sampling),
        **_penalties(sampling),
        logprobs=logprobs_count(sampling),
        embedding_bias=embedding_bias(sampling.logit_bias, context.vocab_size),
        guided_decoding=guided_decoding(llmapi, sampling.output_format, context),
    )


def _basic(sampling: SamplingOptions) -> dict[str, Any]:
    return {
        "max_tokens": sampling.max_tokens,
        "temperature": sampling.temperature,  # 0.0 = greedy
        "top_p": sampling.top_p,
        "top_k": sampling.top_k or None,  # None = runtime default (disabled)
        "min_p": sampling.min_p or None,
        "seed": sampling.seed,
        "stop": list(sampling.stop_strings) or None,
        "stop_token_ids": list(sampling.stop_token_ids) or None,
        "include_stop_str_in_output": False,
        "ignore_eos": sampling.ignore_eos,
        "min_tokens": sampling.min_tokens or None,  # end_id is masked until this many
        "detokenize": sampling.detokenize or bool(sampling.stop_strings),
    }


def _penalties(sampling: SamplingOptions) -> dict[str, float | None]:
    """Neutral values go as None (the runtime default), so no penalty kernel runs for them."""
    repetition = sampling.repetition_penalty
    return {
        "repetition_penalty": None if repetition == 1.0 else repetition,
        "presence_penalty": sampling.presence_penalty or None,
        "frequency_penalty": sampling.frequency_penalty or None,
    }


def logprobs_count(sampling: SamplingOptions) -> int | None:
    """`SamplingParams.logprobs`: how many log probabilities per output token."""
    if sampling.top_logprobs > 0:
        return sampling.top_logprobs
    return 1 if sampling.logprobs else None


def embedding_bias(logit_bias: Iterable[tuple[int, float]], vocab_size: int | None) -> Any:
    """A float32 [vocab_size] tensor with the biases set (None without any), as trtllm-serve
    builds it; the later of two entries for one token wins."""
    biases = dict(logit_bias)
    if not biases:
        return None
    if vocab_size is None:
        raise InvalidRequest(
            "logit_bias needs the model's vocabulary size, which this deployment does not know",
            field=LOGIT_BIAS_FIELD,
        )
    for token_id, bias in biases.items():
        if not 0 <= token_id < vocab_size or not math.isfinite(bias):
            raise InvalidRequest(
                f"logit_bias entry {token_id}: {bias} is outside the vocabulary "
                f"[0, {vocab_size}) or not finite",
                field=LOGIT_BIAS_FIELD,
            )
    return _bias_tensor(biases, vocab_size)


def _bias_tensor(biases: Mapping[int, float], vocab_size: int) -> torch.Tensor:
    import torch  # deferred: only requests with a logit_bias need it

    tensor = torch.zeros(vocab_size, dtype=torch.float32)
    tensor[list(biases)] = torch.tensor(list(biases.values()), dtype=torch.float32)
    return tensor


def guided_decoding(
    llmapi: ModuleType, spec: OutputFormatSpec | None, context: MappingContext
) -> Any:
    """`GuidedDecodingParams` for the requested output format (None without one)."""
    if spec is None:
        return None
    if not context.constrained_decoding:
        raise InvalidRequest(
            "constrained decoding is not enabled on this TensorRT-LLM deployment",
            field=FORMAT_FIELD,
        )
    return llmapi.GuidedDecodingParams(**guide(spec))


def guide(spec: OutputFormatSpec) -> dict[str, Any]:
    """The one GuidedDecodingParams field (and value) that expresses `spec`."""
    kind = spec.kind
    if kind is FormatKind.JSON_OBJECT:
        return {"json_object": True}
    if kind is FormatKind.JSON_SCHEMA:
        _schema(spec.spec, f"{FORMAT_FIELD}.json_schema")
        return {"json": spec.spec}  # a str goes to the executor unchanged
    if kind is FormatKind.REGEX:
        return {"regex": _non_empty(spec.spec, f"{FORMAT_FIELD}.regex")}
    if kind is FormatKind.GRAMMAR:
        return {"grammar": _non_empty(spec.spec, f"{FORMAT_FIELD}.grammar")}
    if kind is FormatKind.CHOICE:
        return {"grammar": choice_grammar(spec.choices)}
    if kind is FormatKind.TAGGED_JSON:
        return {"structural_tag": tagged_json_structural_tag(spec)}
    raise InvalidRequest(f"output format {kind.value!r} is not supported", field=FORMAT_FIELD)


def _non_empty(text: str, field: str) -> str:
    if not text:
        raise InvalidRequest("must not be empty", field=field)
    return text


def _schema(text: str, field: str) -> Any:
    """The parsed JSON schema: an object or a boolean."""
    try:
        schema = json.loads(text)
    except ValueError as exc:
        raise InvalidRequest(f"not valid JSON: {exc}", field=field) from exc
    if not isinstance(schema, dict | bool):
        raise InvalidRequest("a JSON schema must be an object or a boolean", field=field)
    return schema


def choice_grammar(choices: Iterable[str]) -> str:
    """An EBNF grammar (start rule `root`) matching exactly one of `choices`.

    A grammar rather than a regex: EBNF string literals have one escaping rule set (xgrammar's
    lexer takes C escapes and \\uXXXX, which is all json.dumps emits), where a regex would depend
    on which metacharacters the backend's regex dialect treats as special.
    """
    unique = list(dict.fromkeys(choices))
    if not unique or not all(unique):
        raise InvalidRequest("needs one or more non-empty strings", field=f"{FORMAT_FIELD}.choice")
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in unique) + "\n"


def tagged_json_structural_tag(spec: OutputFormatSpec) -> str:
    """xgrammar's structural tag for begin + JSON(schema) + end, 1..max_items times.

    A structural tag rather than an EBNF grammar: TensorRT-LLM's grammar path takes EBNF only, so
    the JSON schema would have to be compiled to EBNF here, by a second converter whose output
    must still parse in the image's xgrammar. The structural tag carries the schema itself, and
    xgrammar compiles it as it compiles json_schema requests. Only formats of xgrammar 0.1.25 are
    used (tag, json_schema, sequence, or, const_string), each with non-empty element lists and
    strings, as that version requires.
    """
    schema = _schema(spec.spec, f"{TAGGED_FIELD}.json_schema")
    count = max(spec.max_items, 1)  # 0 or 1 = exactly one item
    if count > MAX_TAGGED_ITEMS:
        raise InvalidRequest(
            f"at most {MAX_TAGGED_ITEMS} items are supported", field=f"{TAGGED_FIELD}.max_items"
        )
    content = {"type": "json_schema", "json_schema": schema}
    tag = {"type": "tag", "begin": spec.begin, "content": content, "end": spec.end}
    structural_tag = {"type": "structural_tag", "format": _repeated(tag, spec.separator, count)}
    return json.dumps(structural_tag, ensure_ascii=False)


def _repeated(tag: dict[str, Any], separator: str, count: int) -> dict[str, Any]:
    """tag (separator tag){0,count-1} as items(1) = tag, items(k) = tag | tag sep items(k-1)."""
    items = tag
    for _ in range(count - 1):
        tail = [tag, _const(separator), items] if separator else [tag, items]
        items = {"type": "or", "elements": [tag, {"type": "sequence", "elements": tail}]}
    return items


def _const(value: str) -> dict[str, str]:
    return {"type": "const_string", "value": value}


@dataclass(frozen=True, slots=True)
class StepLogprobs:
    """One event's logprobs: each new token's, and its top alternatives (when asked for)."""

    chosen: tuple[float, ...] | None = None
    top: TopLogprobs | None = None


def step_logprobs(completion: Any, token_ids: tuple[int, ...], top_n: int) -> StepLogprobs:
    """The new tokens' logprobs (and top_n alternatives) from `completion.logprobs_diff`."""
    diff = getattr(completion, "logprobs_diff", None)
    if not diff:
        return StepLogprobs()
    entries = list(zip(token_ids, diff, strict=False))
    chosen = tuple(_chosen(token_id, entry) for token_id, entry in entries)
    if top_n <= 0:
        return StepLogprobs(chosen)
    return StepLogprobs(chosen, tuple(_top(entry, top_n) for _, entry in entries))


def _chosen(token_id: int, entry: Any) -> float:
    if not isinstance(entry, Mapping):  # list[float] form: the sampled token's logprob
        return float(entry)
    value = entry.get(token_id)
    # The PyTorch sampler adds the sampled token to the top-k; NaN marks a release that did not.
    return math.nan if value is None else _value(value)


def _top(entry: Any, top_n: int) -> tuple[TopToken, ...]:
    """The top_n alternatives, by rank (or by logprob where a release gives no rank)."""
    if not isinstance(entry, Mapping):  # list[float] form carries no alternatives
        return ()
    ranked = sorted(entry.items(), key=lambda item: (_rank(item[1]), -_value(item[1])))
    return tuple(TopToken(int(token_id), _value(value)) for token_id, value in ranked[:top_n])


def _value(logprob: Any) -> float:
    return float(getattr(logprob, "logprob", logprob))


def _rank(logprob: Any) -> float:
    rank = getattr(logprob, "rank", None)
    return math.inf if rank is None else float(rank)


def checkpoint_vocab_size(checkpoint: Path) -> int | None:
    """`vocab_size` from the checkpoint's config.json (HF: top level or text_config; a built
    engine: pretrained_config); None when it has none."""
    try:
        config = json.loads((checkpoint / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(config, Mapping):
        return None
    for section in (config, config.get("text_config"), config.get("pretrained_config")):
        if isinstance(section, Mapping) and isinstance(section.get("vocab_size"), int):
            return int(section["vocab_size"])
    return None
