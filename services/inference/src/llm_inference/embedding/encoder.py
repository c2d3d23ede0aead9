"""Texts -> sentence vectors: tokenize, run the BERT encoder in length-sorted batches, mean-pool."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import torch
import torch.nn.functional as F  # noqa: N812 - the conventional alias
from tokenizers import Encoding, Tokenizer

from llm_common.config import ConfigError
from llm_inference.embedding.bert import BertEncoder, load_encoder, mean_pool

DEFAULT_MAX_LENGTH = 256  # sentence-transformers' default when the checkpoint names none


@dataclass(frozen=True, slots=True)
class EmbeddingResult:
    """Vectors in input order and the tokens it took to compute them."""

    vectors: list[list[float]]
    prompt_tokens: int
    dimensions: int


class SentenceEncoder:
    """A BERT encoder with its tokenizer; `encode` is blocking (call it from a worker thread)."""

    def __init__(
        self, model: BertEncoder, tokenizer: Tokenizer, *, max_length: int, batch_size: int
    ) -> None:
        self._model = model
        self._tokenizer = tokenizer
        self._device = next(model.parameters()).device
        self.max_length = max_length
        self.batch_size = batch_size
        tokenizer.no_padding()  # batches are padded here, to their own longest text
        tokenizer.enable_truncation(max_length)

    @classmethod
    def from_dir(
        cls,
        directory: Path,
        *,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
        batch_size: int = 32,
    ) -> Self:
        """Load config.json, model.safetensors and tokenizer.json of an HF BERT checkpoint."""
        model = load_encoder(directory, dtype=dtype, device=torch.device(device))
        tokenizer_path = directory / "tokenizer.json"
        if not tokenizer_path.is_file():
            raise ConfigError(f"embedding checkpoint: {tokenizer_path} not found")
        tokenizer = Tokenizer.from_file(str(tokenizer_path))
        max_length = min(_max_length(directory), model.config.max_position_embeddings)
        return cls(model, tokenizer, max_length=max_length, batch_size=batch_size)

    @property
    def dimensions(self) -> int:
        return self._model.config.hidden_size

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def dtype(self) -> torch.dtype:
        return next(self._model.parameters()).dtype

    def encode(self, texts: Sequence[str], *, normalize: bool = False) -> EmbeddingResult:
        """One vector per text (truncated at `max_length` tokens), in input order."""
        encodings = self._tokenizer.encode_batch(list(texts))
        vectors: list[list[float]] = [[] for _ in encodings]
        # Sorting by length keeps padding (wasted compute) small within each batch.
        order = sorted(range(len(encodings)), key=lambda i: len(encodings[i].ids))
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            pooled = self._forward([encodings[i] for i in chunk], normalize)
            for index, vector in zip(chunk, pooled.tolist(), strict=True):
                vectors[index] = vector
        tokens = sum(len(e.ids) for e in encodings)
        return EmbeddingResult(vectors=vectors, prompt_tokens=tokens, dimensions=self.dimensions)

    @torch.inference_mode()
    def _forward(self, batch: Sequence[Encoding], normalize: bool) -> torch.Tensor:
        length = max(len(e.ids) for e in batch)
        ids = torch.zeros((len(batch), length), dtype=torch.long)
        mask = torch.zeros((len(batch), length), dtype=torch.long)
        for row, encoding in enumerate(batch):
            ids[row, : len(encoding.ids)] = torch.tensor(encoding.ids)
            mask[row, : len(encoding.ids)] = 1
        ids, mask = ids.to(self._device), mask.to(self._device)
        pooled = mean_pool(self._model(ids, mask), mask).float()
        return F.normalize(pooled, p=2, dim=1) if normalize else pooled


def _max_length(directory: Path) -> int:
    # sentence-transformers keeps the encoder's truncation length in sentence_bert_config.json.
    path = directory / "sentence_bert_config.json"
    if not path.is_file():
        return DEFAULT_MAX_LENGTH
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get("max_seq_length")
    except (OSError, ValueError, AttributeError) as exc:
        raise ConfigError(f"embedding checkpoint: cannot read {path}: {exc}") from exc
    if not isinstance(value, int) or value <= 0:
        raise ConfigError(f"embedding checkpoint: {path}: max_seq_length must be positive")
    return value
