"""The inference service's face of the shared sentence encoder (llm_embed): vectors as
lists for the protobuf reply, token usage, and load errors as ConfigError."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import torch

from llm_common.config import ConfigError
from llm_embed import ModelLoadError
from llm_embed import SentenceEncoder as SharedEncoder


@dataclass(frozen=True, slots=True)
class EmbeddingResult:
    """Vectors in input order and the tokens it took to compute them."""

    vectors: list[list[float]]
    prompt_tokens: int
    dimensions: int


class SentenceEncoder:
    """A BERT encoder with its tokenizer; `encode` is blocking (call it from a worker thread)."""

    def __init__(self, shared: SharedEncoder) -> None:
        self._shared = shared

    @classmethod
    def from_dir(
        cls,
        directory: Path,
        *,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
        batch_size: int = 32,
    ) -> Self:
        """Load config.json, model.safetensors and tokenizer.json of an HF BERT checkpoint;
        the truncation length comes from its sentence_bert_config.json (else 256)."""
        try:
            shared = SharedEncoder.from_dir(
                directory, batch_size=batch_size, dtype=dtype, device=device
            )
        except ModelLoadError as exc:
            raise ConfigError(str(exc)) from exc
        return cls(shared)

    @property
    def max_length(self) -> int:
        return self._shared.max_length

    @property
    def batch_size(self) -> int:
        return self._shared.batch_size or 1

    @property
    def dimensions(self) -> int:
        return self._shared.dimensions

    @property
    def device(self) -> torch.device:
        return self._shared.device

    @property
    def dtype(self) -> torch.dtype:
        return self._shared.dtype

    def encode(self, texts: Sequence[str], *, normalize: bool = False) -> EmbeddingResult:
        """One vector per text (truncated at `max_length` tokens), in input order."""
        embedded = self._shared.encode(texts, normalize=normalize)
        return EmbeddingResult(
            vectors=embedded.vectors.tolist(),
            prompt_tokens=sum(embedded.token_counts),
            dimensions=self.dimensions,
        )
