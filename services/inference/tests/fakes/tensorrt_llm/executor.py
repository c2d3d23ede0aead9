"""Stand-in for `tensorrt_llm.executor` (`executor/result.py`): Logprob and CompletionOutput with
the real fields (tensorrt_llm/executor/result.py; CompletionOutput's as in the 1.3.0rc26 API
reference, see tests/unit/trtllm_real_api.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Logprob:
    """Holds logprob and vocab rank for a token."""

    logprob: float
    rank: int | None = None


# One dict per generated token: the top-k tokens (ranks 1..k), plus the sampled token (rank > k)
# when it is not among them, as the PyTorch backend's sampler fills it.
TokenLogprobs = list[dict[int, Logprob]]


@dataclass
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    cumulative_logprob: float | None = None
    logprobs: TokenLogprobs = field(default_factory=list)
    prompt_logprobs: TokenLogprobs = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    generation_logits: Any = None
    additional_context_outputs: dict[str, Any] | None = None
    additional_generation_outputs: dict[str, Any] | None = None
    disaggregated_params: Any = None
    request_perf_metrics: Any = None
    _last_text_len: int = 0
    _last_token_ids_len: int = 0
    _last_logprobs_len: int = 0

    @property
    def length(self) -> int:
        return len(self.token_ids)

    @property
    def text_diff(self) -> str:
        return self.text[self._last_text_len :]

    @property
    def token_ids_diff(self) -> list[int]:
        return self.token_ids[self._last_token_ids_len :]

    @property
    def logprobs_diff(self) -> TokenLogprobs:
        return self.logprobs[self._last_logprobs_len :]

    def _mark_read(self) -> None:
        self._last_text_len = len(self.text)
        self._last_token_ids_len = len(self.token_ids)
        self._last_logprobs_len = len(self.logprobs)
