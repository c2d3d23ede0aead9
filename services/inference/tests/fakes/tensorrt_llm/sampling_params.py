"""Stand-in for `tensorrt_llm.sampling_params`: SamplingParams and GuidedDecodingParams with the
real constructor signatures (kw-only slots dataclasses, same field names, order and defaults as
NVIDIA/TensorRT-LLM `tensorrt_llm/sampling_params.py` at commit a98a9061, private fields left out),
so a misspelt or removed field fails here as it would there.

Beyond the real `_validate` checks, the stand-in checks the types the real annotations declare
(the real classes do not), so a value of the wrong kind fails a test instead of a GPU run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any

import torch


@dataclass(slots=True, kw_only=True)
class GuidedDecodingParams:
    json: str | dict[str, Any] | None = None  # real: Optional[Union[str, BaseModel, dict]]
    regex: str | None = None
    grammar: str | None = None
    json_object: bool = False
    structural_tag: str | None = None

    def __post_init__(self) -> None:  # stand-in only: the annotated types
        _check_types(
            self,
            json=(str, dict, type(None)), regex=(str, type(None)), grammar=(str, type(None)),
            json_object=(bool,), structural_tag=(str, type(None)),
        )  # fmt: skip

    def _validate(self) -> None:
        num_guides = sum(bool(getattr(self, f.name)) for f in fields(self))
        if num_guides > 1:
            raise ValueError(f"Only one guide can be used for a request, but got {num_guides}.")


@dataclass(slots=True, kw_only=True)
class SamplingParams:
    end_id: int | None = None
    pad_id: int | None = None
    max_tokens: int = 32
    bad: str | list[str] | None = None
    bad_token_ids: list[int] | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    embedding_bias: torch.Tensor | None = None
    logits_processor: Any = None
    apply_batched_logits_processor: bool = False
    n: int = 1
    best_of: int | None = None
    use_beam_search: bool = False
    top_k: int | None = None
    top_p: float | None = None
    top_p_min: float | None = None
    top_p_reset_ids: int | None = None
    top_p_decay: float | None = None
    seed: int | None = None
    temperature: float | None = None
    min_tokens: int | None = None
    beam_search_diversity_rate: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    length_penalty: float | None = None
    early_stopping: int | None = None
    no_repeat_ngram_size: int | None = None
    min_p: float | None = None
    beam_width_array: list[int] | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    return_context_logits: bool = False
    return_generation_logits: bool = False
    exclude_input_from_output: bool = True
    return_encoder_output: bool = False
    return_perf_metrics: bool = False
    additional_model_outputs: list[str] | None = None
    lookahead_config: Any = None
    guided_decoding: GuidedDecodingParams | None = None
    ignore_eos: bool = False
    detokenize: bool = True
    add_special_tokens: bool = True
    truncate_prompt_tokens: int | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True

    def __post_init__(self) -> None:
        if self.pad_id is None:
            self.pad_id = self.end_id
        self.best_of = self.best_of or self.n
        self._check_annotated_types()
        self._validate()

    def _check_annotated_types(self) -> None:  # stand-in only
        optional_float, optional_int = (float, int, type(None)), (int, type(None))
        _check_types(
            self,
            temperature=optional_float, top_p=optional_float, min_p=optional_float,
            repetition_penalty=optional_float, presence_penalty=optional_float,
            frequency_penalty=optional_float, top_k=optional_int, seed=optional_int,
            min_tokens=optional_int, logprobs=(int, bool, type(None)), max_tokens=(int,),
            guided_decoding=(GuidedDecodingParams, type(None)),
        )  # fmt: skip
        bias = (
            self.embedding_bias
        )  # real docstring: "Expected type is kFP32 and shape is [vocab_size]"
        if bias is not None and not (
            isinstance(bias, torch.Tensor) and bias.dtype == torch.float32 and bias.dim() == 1
        ):
            raise TypeError(f"embedding_bias must be a 1-D float32 tensor, got {bias!r}")

    def _validate(self) -> None:  # as the real one
        if self.top_p is not None and (self.top_p < 0 or self.top_p > 1):
            raise ValueError(f"require 0 <= top_p <= 1, got top_p={self.top_p}")
        if self.top_k is not None and self.top_k < 0:
            raise ValueError(f"require top_k >= 0, got top_k={self.top_k}")
        if self.temperature is not None and self.temperature < 0:
            raise ValueError(f"require temperature >= 0, got temperature={self.temperature}")
        if self.best_of is not None and self.best_of < self.n:
            raise ValueError(f"best_of ({self.best_of}) cannot be less than n ({self.n})")
        if (
            self.best_of is not None
            and self.best_of > 1
            and self._greedy_decoding
            and not os.environ.get("TLLM_ALLOW_N_GREEDY_DECODING")
        ):
            raise ValueError("Greedy decoding in the LLM API does not allow multiple returns.")
        if self.truncate_prompt_tokens is not None and self.truncate_prompt_tokens < 1:
            raise ValueError(
                f"truncate_prompt_tokens must be >= 1, got {self.truncate_prompt_tokens}"
            )
        if self.guided_decoding is not None:
            self.guided_decoding._validate()
        self.logprobs = self.logprobs and int(self.logprobs)
        self.prompt_logprobs = self.prompt_logprobs and int(self.prompt_logprobs)

    @property
    def _greedy_decoding(self) -> bool:
        return not self.use_beam_search and (
            (self.temperature is None and self.top_p is None and self.top_k is None)
            or self.top_k == 1
            or self.top_p == 0.0
            or self.temperature == 0
        )


def _check_types(obj: object, **expected: tuple[type, ...]) -> None:
    for name, types in expected.items():
        value = getattr(obj, name)
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise TypeError(f"{type(obj).__name__}.{name}: {value!r} is not {types}")
