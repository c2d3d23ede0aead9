"""Settings.from_env: defaults, overrides, and errors that name the variable."""

from __future__ import annotations

from pathlib import Path

import pytest

from llm_common.config import ConfigError
from llm_common.tokenization import messages
from llm_tokenizer.config import Limits, Settings


def test_defaults() -> None:
    settings = Settings.from_env({})
    assert settings.server.grpc_port == 50052
    assert settings.server.metrics_port == 9152
    assert settings.server.service_name == "tokenizer"
    assert settings.models_config == Path("infra/config/models.yaml")
    assert settings.model_root == Path(".cache/models")
    assert settings.limits == Limits(1024, 1 << 20, 1 << 20, 1024)


def test_message_limit_defaults_match_the_shared_ones() -> None:
    # The router checks messages in-process with the shared defaults: same answers as ours.
    assert Limits().max_messages == messages.DEFAULT_MAX_MESSAGES
    assert Limits().max_text_bytes == messages.DEFAULT_MAX_TEXT_BYTES


def test_overrides() -> None:
    settings = Settings.from_env(
        {
            "GRPC_PORT": "0",
            "METRICS_PORT": "off",
            "MODELS_CONFIG": "/etc/llm/models.yaml",
            "MODEL_ROOT": "/models",
            "TOKENIZER_MAX_BATCH": "8",
            "TOKENIZER_MAX_TEXT_BYTES": "100",
            "TOKENIZER_MAX_IDS_PER_SEQUENCE": "50",
            "TOKENIZER_MAX_MESSAGES": "4",
        }
    )
    assert settings.server.grpc_port == 0
    assert settings.server.metrics_port is None
    assert settings.models_config == Path("/etc/llm/models.yaml")
    assert settings.model_root == Path("/models")
    assert settings.limits == Limits(8, 100, 50, 4)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("GRPC_PORT", "http"),
        ("GRPC_PORT", "70000"),
        ("TOKENIZER_MAX_BATCH", "0"),
        ("TOKENIZER_MAX_TEXT_BYTES", "lots"),
        ("TOKENIZER_MAX_MESSAGES", "-1"),
    ],
)
def test_invalid_values_name_the_variable(variable: str, value: str) -> None:
    with pytest.raises(ConfigError, match=variable) as info:
        Settings.from_env({variable: value})
    assert info.value.variable == variable


def test_limits_reject_non_positive_values() -> None:
    with pytest.raises(ConfigError, match="TOKENIZER_MAX_IDS_PER_SEQUENCE"):
        Limits(max_ids_per_sequence=0)
