"""The semantic-hit verifier: a small cross-encoder that reads the stored and the new prompt
together and scores "one answer serves both".

Sentence embeddings place "is A faster than B" next to "is B faster than A", and "as a
table" next to "as a list"; a model that attends across both prompts sees the difference.
It runs only on the candidates the embedding search found above the threshold, in the
semantic worker, one forward pass per batch of lookups (docs/adr/0013).

The model: the first `layers` layers of the encoder's own BERT (all-MiniLM-L6-v2), its
embeddings frozen and read from the encoder checkpoint, fine-tuned on sentence pairs
(`[CLS] stored [SEP] query [SEP]`, token types 0/1), mean-pooled into one logit. The shipped
files (`verifier_model/`) hold only what training changed: the layers and the head.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import numpy as np
import numpy.typing as npt
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer
from torch import nn

from llm_embed import BertConfig, BertEncoder, load_bert

Tokens = tuple[int, ...]
Scores = npt.NDArray[np.float32]
_CLS, _SEP, _PAD = "[CLS]", "[SEP]", 0


class VerifierLoadError(Exception):
    """The verifier's files are missing or do not fit the encoder checkpoint."""


def default_verifier_dir() -> Path:
    """The verifier shipped inside this package."""
    return Path(__file__).resolve().parent / "verifier_model"


@dataclass(frozen=True, slots=True)
class OperatingPoint:
    """A mode's decision: probability >= `probability` and cosine >= the lookup's threshold
    plus `similarity_margin`."""

    probability: float
    similarity_margin: float


@dataclass(frozen=True, slots=True)
class VerifierSpec:
    """verifier_model/config.json: the architecture and the operating points, which were
    chosen on the tuning split (services/cache/training/README.md)."""

    layers: int
    side_tokens: int  # word pieces kept per prompt
    base_weights_sha256: str  # the encoder checkpoint whose embeddings the layers expect
    modes: dict[str, OperatingPoint]  # "balanced", "strict"
    # "int8": Linear layers dynamically quantized at load (`_int8`; about 1.3x faster than
    # float32 on CPU; the operating points were chosen with it); "none": the caller's dtype.
    quantize: str = "none"

    @classmethod
    def from_file(cls, path: Path) -> Self:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return cls(
                layers=int(data["layers"]),
                side_tokens=int(data["side_tokens"]),
                base_weights_sha256=str(data["base_weights_sha256"]),
                modes={
                    str(k): OperatingPoint(float(v["probability"]), float(v["similarity_margin"]))
                    for k, v in data["modes"].items()
                },
                quantize=str(data.get("quantize", "none")),
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise VerifierLoadError(f"unreadable verifier config {path}: {exc}") from exc


class PairClassifier(nn.Module):
    """BERT layers over a prompt pair, mean pooled, one logit."""

    def __init__(self, bert: BertEncoder, layers: int) -> None:
        super().__init__()
        if not 0 < layers <= len(bert.encoder.layer):
            raise VerifierLoadError(f"the encoder has no {layers} layers to keep")
        self.embeddings = bert.embeddings
        self.layers = nn.ModuleList(list(bert.encoder.layer)[:layers])
        self.head = nn.Linear(bert.config.hidden_size, 1)

    def forward(self, ids: torch.Tensor, types: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Logits [batch] for right-padded pair ids with their token types and mask."""
        e = self.embeddings
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = e.word_embeddings(ids) + e.position_embeddings(positions)
        x = e.LayerNorm(x + e.token_type_embeddings(types))
        attend = mask.bool()[:, None, None, :]
        for layer in self.layers:
            x = layer(x, attend)
        weights = mask.unsqueeze(-1).to(x.dtype)
        pooled = (x * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
        logits: torch.Tensor = self.head(pooled).squeeze(-1)
        return logits

    def trained_state(self) -> dict[str, torch.Tensor]:
        """The tensors training changes (layers and head): what is shipped."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith("embeddings.")}


class PairTokenizer:
    """Word pieces per prompt (no special tokens, cut at `side_tokens`) and pair batches."""

    def __init__(self, encoder_dir: Path, side_tokens: int) -> None:
        path = encoder_dir / "tokenizer.json"
        if not path.is_file():
            raise VerifierLoadError(f"no tokenizer.json in {encoder_dir}")
        self._tokenizer = Tokenizer.from_file(str(path))
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()
        self.side_tokens = side_tokens
        self._cls = self._tokenizer.token_to_id(_CLS)
        self._sep = self._tokenizer.token_to_id(_SEP)

    def tokens(self, texts: Sequence[str]) -> list[Tokens]:
        encoded = self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [tuple(e.ids[: self.side_tokens]) for e in encoded]

    def batch(self, pairs: Sequence[tuple[Tokens, Tokens]]) -> tuple[torch.Tensor, ...]:
        """ids, token types and mask for `[CLS] a [SEP] b [SEP]` rows, right-padded."""
        rows = [((self._cls, *a, self._sep), (*b, self._sep)) for a, b in pairs]
        width = max(len(a) + len(b) for a, b in rows)
        ids = torch.full((len(rows), width), _PAD, dtype=torch.long)
        types = torch.zeros((len(rows), width), dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, (a, b) in enumerate(rows):
            n = len(a) + len(b)
            ids[i, :n] = torch.tensor(a + b)
            types[i, len(a) : n] = 1
            mask[i, :n] = 1
        return ids, types, mask


def base_model(encoder_dir: Path, layers: int) -> PairClassifier:
    """A fresh classifier over the encoder checkpoint's first `layers` layers (training)."""
    return PairClassifier(load_bert(encoder_dir), layers)


class Verifier:
    """Scores (stored, query) token pairs: the probability that one answer serves both.

    Thread-safe for one caller at a time (the semantic worker); CPU, inference mode.
    """

    def __init__(
        self, model_dir: Path, encoder_dir: Path, *, dtype: torch.dtype = torch.float32
    ) -> None:
        self.spec = VerifierSpec.from_file(model_dir / "config.json")
        self.tokenizer = PairTokenizer(encoder_dir, self.spec.side_tokens)
        model = _load(model_dir, encoder_dir, self.spec).eval()
        if self.spec.quantize == "int8":
            model, dtype = _int8(model), torch.float32
        self._model = model.to(dtype)
        self.dtype = dtype

    def point(self, mode: str) -> OperatingPoint:
        """The operating point of `mode` (strict, balanced)."""
        return self.spec.modes[mode]

    @property
    def modes(self) -> tuple[str, ...]:
        return tuple(self.spec.modes)

    def tokens(self, texts: Sequence[str]) -> list[Tokens]:
        return self.tokenizer.tokens(texts)

    def token_bytes(self, texts: Sequence[str]) -> list[bytes]:
        """Word pieces packed as uint16 (the index keeps these: 2 bytes a token)."""
        return [np.asarray(t, np.uint16).tobytes() for t in self.tokens(texts)]

    def score_bytes(self, pairs: Sequence[tuple[bytes, bytes]]) -> Scores:
        """`score` over (stored, query) pairs of packed word pieces."""
        return self.score([(_unpack(a), _unpack(b)) for a, b in pairs])

    def score(self, pairs: Sequence[tuple[Tokens, Tokens]]) -> Scores:
        """One forward pass over every pair; probabilities in [0, 1]."""
        if not pairs:
            return np.zeros(0, np.float32)
        ids, types, mask = self.tokenizer.batch(pairs)
        with torch.inference_mode():
            logits = self._model(ids, types, mask).float()
        return torch.sigmoid(logits).numpy().astype(np.float32, copy=False)


def _int8(model: PairClassifier) -> PairClassifier:
    """Linear layers with int8 per-channel weights and dynamically quantized activations,
    except each layer's feed-forward output projection: its GELU inputs have outliers that
    one per-tensor activation scale flattens (all-int8 moved probabilities by up to 0.8
    against float32; this keeps them within 0.3 for about 1 ms more a pair, ADR 0021)."""
    qconfig = torch.ao.quantization.per_channel_dynamic_qconfig
    names = {
        name: qconfig
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear)
        and not (name.endswith(".output.dense") and ".attention." not in name)
    }
    with warnings.catch_warnings():  # torch's notice that this API moves to torchao
        warnings.simplefilter("ignore")
        quantized: PairClassifier = torch.ao.quantization.quantize_dynamic(  # type: ignore[no-untyped-call]
            model, names, dtype=torch.qint8
        )
    return quantized


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _unpack(packed: bytes) -> Tokens:
    return tuple(np.frombuffer(packed, np.uint16).tolist())


def _load(model_dir: Path, encoder_dir: Path, spec: VerifierSpec) -> PairClassifier:
    weights = model_dir / "model.safetensors"
    if not weights.is_file():
        raise VerifierLoadError(f"no model.safetensors in {model_dir}")
    base = encoder_dir / "model.safetensors"
    if not base.is_file() or _sha256(base) != spec.base_weights_sha256:
        raise VerifierLoadError(
            f"the verifier was trained on other encoder weights than {encoder_dir}'s"
        )
    config = BertConfig.from_file(encoder_dir / "config.json")
    if spec.layers > config.num_hidden_layers:
        raise VerifierLoadError("the verifier has more layers than the encoder checkpoint")
    model = PairClassifier(load_bert(encoder_dir), spec.layers)
    state = {k: v.float() for k, v in load_file(str(weights)).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or any(not k.startswith("embeddings.") for k in missing):
        raise VerifierLoadError(f"verifier weights do not fit: {missing[:3]} {unexpected[:3]}")
    return model
