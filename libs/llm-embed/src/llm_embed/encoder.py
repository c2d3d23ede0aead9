"""Texts -> sentence vectors: tokenize, run BERT in length-sorted batches, mean-pool."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F  # noqa: N812 - the torch convention
from tokenizers import Encoding, Tokenizer

from llm_embed.bert import BertEncoder, ModelLoadError, load_bert, mean_pool

DEFAULT_MAX_LENGTH = 256  # sentence-transformers' default when the checkpoint names none


@dataclass(frozen=True, slots=True)
class Embedded:
    """One float32 row per text in input order, the tokens each text took (special tokens
    included, after truncation) and which texts were cut at `max_length`."""

    vectors: npt.NDArray[np.float32]
    token_counts: tuple[int, ...]
    truncated: tuple[bool, ...]


class SentenceEncoder:
    """A BERT encoder with its tokenizer. `encode` is blocking and runs under
    torch.inference_mode; call it from one thread at a time. Never touches the network."""

    def __init__(
        self,
        model: BertEncoder,
        tokenizer: Tokenizer,
        *,
        max_length: int,
        batch_size: int | None = None,
    ) -> None:
        self._model = model
        self._tokenizer = tokenizer
        self.max_length = max_length
        # None: every call is one forward pass, padded to its longest text.
        self.batch_size = batch_size
        tokenizer.no_padding()  # batches are padded here, to their own longest text
        tokenizer.enable_truncation(max_length)

    @classmethod
    def from_dir(
        cls,
        directory: Path,
        *,
        max_length: int | None = None,
        batch_size: int | None = None,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> Self:
        """Load tokenizer.json, config.json and model.safetensors of a BERT checkpoint.
        `max_length` None: the checkpoint's sentence-transformers setting, else 256."""
        tokenizer_path = directory / "tokenizer.json"
        if not tokenizer_path.is_file():
            raise ModelLoadError(f"embedding checkpoint: no tokenizer.json in {directory}")
        model = load_bert(directory, dtype=dtype, device=device)
        limit = _checkpoint_max_length(directory) if max_length is None else max_length
        limit = min(limit, model.config.max_position_embeddings)
        tokenizer = Tokenizer.from_file(str(tokenizer_path))
        return cls(model, tokenizer, max_length=limit, batch_size=batch_size)

    @property
    def dimensions(self) -> int:
        return self._model.config.hidden_size

    @property
    def device(self) -> torch.device:
        return next(self._model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self._model.parameters()).dtype

    def encode(self, texts: Sequence[str], *, normalize: bool = True) -> Embedded:
        """Mean-pooled vectors (unit length when `normalize`), one per text."""
        encodings = self._tokenizer.encode_batch(list(texts))
        vectors = np.zeros((len(encodings), self.dimensions), np.float32)
        # Sorting by length keeps padding (wasted compute) small within each batch.
        order = sorted(range(len(encodings)), key=lambda i: len(encodings[i].ids))
        step = self.batch_size or max(len(order), 1)
        for start in range(0, len(order), step):
            chunk = order[start : start + step]
            vectors[chunk] = self._forward([encodings[i] for i in chunk], normalize).numpy()
        return Embedded(
            vectors=vectors,
            token_counts=tuple(len(e.ids) for e in encodings),
            truncated=tuple(bool(e.overflowing) for e in encodings),
        )

    def token_counts(self, texts: Sequence[str]) -> list[int]:
        """Tokens per text as the encoder sees them (special tokens included, truncated)."""
        return [len(e.ids) for e in self._tokenizer.encode_batch(list(texts))]

    @torch.inference_mode()
    def _forward(self, batch: Sequence[Encoding], normalize: bool) -> torch.Tensor:
        length = max(len(e.ids) for e in batch)
        ids = torch.zeros((len(batch), length), dtype=torch.long)
        mask = torch.zeros((len(batch), length), dtype=torch.long)
        for row, encoding in enumerate(batch):
            ids[row, : len(encoding.ids)] = torch.tensor(encoding.ids)
            mask[row, : len(encoding.ids)] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        # Pooled in float32 whatever the model's dtype: bfloat16 states are widened first.
        pooled = mean_pool(self._model(ids, mask).float(), mask)
        return (F.normalize(pooled, p=2.0, dim=1) if normalize else pooled).cpu()


def _checkpoint_max_length(directory: Path) -> int:
    # sentence-transformers keeps the encoder's truncation length in sentence_bert_config.json.
    path = directory / "sentence_bert_config.json"
    if not path.is_file():
        return DEFAULT_MAX_LENGTH
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get("max_seq_length")
    except (OSError, ValueError, AttributeError) as exc:
        raise ModelLoadError(f"embedding checkpoint: cannot read {path}: {exc}") from exc
    if not isinstance(value, int) or value <= 0:
        raise ModelLoadError(f"embedding checkpoint: {path}: max_seq_length must be positive")
    return value
