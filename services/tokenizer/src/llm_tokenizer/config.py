"""Tokenizer service settings, read from the environment once in __main__ (tests pass dicts)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from llm_common.config import (
    MIB,
    ServerSettings,
    env_str,
    positive_ints_from_env,
    require_positive,
)
from llm_common.tokenization.messages import DEFAULT_MAX_MESSAGES, DEFAULT_MAX_TEXT_BYTES

SERVICE_NAME = "tokenizer"
DEFAULT_GRPC_PORT = 50052
DEFAULT_METRICS_PORT = 9152
DEFAULT_MODELS_CONFIG = "infra/config/models.yaml"
DEFAULT_MODEL_ROOT = ".cache/models"


@dataclass(frozen=True, slots=True)
class Limits:
    """Request size limits; every one is checked before any tokenizer work starts."""

    max_batch: int = 1024  # texts per Encode/CountTokens, sequences per Decode
    max_text_bytes: int = DEFAULT_MAX_TEXT_BYTES  # UTF-8 bytes per text; also per chat
    max_ids_per_sequence: int = MIB  # ids per Decode sequence
    max_messages: int = DEFAULT_MAX_MESSAGES  # messages per chat

    def __post_init__(self) -> None:
        require_positive(self, _LIMIT_VARIABLES)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Self:
        return cls(**positive_ints_from_env(environ, _LIMIT_VARIABLES, cls()))


_LIMIT_VARIABLES = {
    "max_batch": "TOKENIZER_MAX_BATCH",
    "max_text_bytes": "TOKENIZER_MAX_TEXT_BYTES",
    "max_ids_per_sequence": "TOKENIZER_MAX_IDS_PER_SEQUENCE",
    "max_messages": "TOKENIZER_MAX_MESSAGES",
}


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the tokenizer service needs to run."""

    server: ServerSettings
    models_config: Path = Path(DEFAULT_MODELS_CONFIG)
    model_root: Path = Path(DEFAULT_MODEL_ROOT)
    limits: Limits = field(default_factory=Limits)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Self:
        """Read GRPC_PORT, METRICS_PORT, ... (see ServerSettings), MODELS_CONFIG, MODEL_ROOT and
        TOKENIZER_MAX_*; ConfigError names the offending variable."""
        server = ServerSettings.from_env(
            environ,
            service_name=SERVICE_NAME,
            default_grpc_port=DEFAULT_GRPC_PORT,
            default_metrics_port=DEFAULT_METRICS_PORT,
        )
        return cls(
            server=server,
            models_config=Path(env_str(environ, "MODELS_CONFIG", DEFAULT_MODELS_CONFIG)),
            model_root=Path(env_str(environ, "MODEL_ROOT", DEFAULT_MODEL_ROOT)),
            limits=Limits.from_env(environ),
        )
