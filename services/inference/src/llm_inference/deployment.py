"""Which model this replica serves: its catalogue entry, checkpoint and vocabulary facts."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llm_common.config import ConfigError
from llm_common.models_config import load_catalog
from llm_inference.config import Settings

GENERATION = "generation"
EMBEDDING = "embedding"


@dataclass(frozen=True, slots=True)
class ModelDeployment:
    """The model of this replica, resolved from models.yaml (and INFERENCE_CHECKPOINT)."""

    name: str
    kind: str  # "generation" or "embedding"
    checkpoint: Path
    context_length: int
    default_max_tokens: int


@dataclass(frozen=True, slots=True)
class ModelFacts:
    """What request validation needs to know about a generation model."""

    vocab_size: int
    max_context: int  # prompt + completion tokens
    default_max_tokens: int


def resolve_deployment(settings: Settings) -> ModelDeployment:
    """The catalogue entry named by INFERENCE_MODEL; ConfigError if unknown or not on disk."""
    catalog = load_catalog(settings.models_config, settings.model_root)
    spec = catalog.resolve(settings.model)
    if spec is None:
        known = ", ".join(catalog.names())
        raise ConfigError.for_variable(
            "INFERENCE_MODEL", f"unknown model {settings.model!r} (known: {known})"
        )
    checkpoint = settings.checkpoint if settings.checkpoint is not None else spec.checkpoint
    if not (checkpoint / "config.json").is_file():
        variable = "INFERENCE_CHECKPOINT" if settings.checkpoint is not None else "MODELS_CONFIG"
        raise ConfigError.for_variable(
            variable, f"model {spec.name}: no config.json in checkpoint directory {checkpoint}"
        )
    return ModelDeployment(
        name=spec.name,
        kind=spec.kind,
        checkpoint=checkpoint,
        context_length=spec.context_length,
        default_max_tokens=spec.default_max_tokens,
    )


def read_model_config(checkpoint: Path) -> dict[str, Any]:
    """The checkpoint's config.json; ConfigError when unreadable."""
    path = checkpoint / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"checkpoint: cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"checkpoint: {path} is not a JSON object")
    return data


def checkpoint_context(checkpoint: Path, limit: int | None = None) -> int:
    """`limit` (the catalogue's context length), unless the checkpoint's positions are fewer."""
    positions = read_model_config(checkpoint).get("max_position_embeddings")
    if isinstance(positions, int) and positions > 0:
        return positions if limit is None else min(limit, positions)
    if limit is None:
        raise ConfigError(f"checkpoint: {checkpoint} config.json has no max_position_embeddings")
    return limit


def model_facts(deployment: ModelDeployment, engine_max_context: int) -> ModelFacts:
    """Validation facts: the vocabulary from config.json, the tighter of both context limits."""
    vocab_size = read_model_config(deployment.checkpoint).get("vocab_size")
    if not isinstance(vocab_size, int) or vocab_size <= 0:
        raise ConfigError(f"checkpoint: {deployment.checkpoint} config.json has no vocab_size")
    max_context = min(deployment.context_length, engine_max_context)
    return ModelFacts(
        vocab_size=vocab_size,
        max_context=max_context,
        default_max_tokens=min(deployment.default_max_tokens, max_context - 1),
    )
