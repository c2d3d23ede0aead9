"""serve_service: settings → logging → start; configuration errors exit 2 with one line."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pytest

from llm_common.cli import EXIT_CONFIG_ERROR, config_errors_exit, serve_service
from llm_common.config import ConfigError, ServerSettings, env_int


@dataclass(frozen=True)
class Settings:
    server: ServerSettings
    size: int

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Settings:
        server = ServerSettings.from_env(
            environ, service_name="demo", default_grpc_port=1, default_metrics_port=2
        )
        return cls(server, env_int(environ, "DEMO_SIZE", 3, min_value=1))


def test_runs_start_with_the_settings() -> None:
    seen: list[Settings] = []

    async def start(settings: Settings) -> None:
        seen.append(settings)

    serve_service("llm-demo", Settings.from_env, start, {"DEMO_SIZE": "7", "METRICS_PORT": "off"})
    assert [s.size for s in seen] == [7]
    assert seen[0].server.metrics_port is None


def test_bad_variable_exits_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    async def start(settings: Settings) -> None:
        raise AssertionError("must not start")

    with pytest.raises(SystemExit) as exit_info:
        serve_service("llm-demo", Settings.from_env, start, {"DEMO_SIZE": "zero"})
    assert exit_info.value.code == EXIT_CONFIG_ERROR
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("llm-demo: configuration error: DEMO_SIZE")


def test_errors_raised_while_starting_exit_2_too(capsys: pytest.CaptureFixture[str]) -> None:
    async def start(settings: Settings) -> None:
        raise ConfigError("MODEL_ROOT: no checkpoint")

    with pytest.raises(SystemExit):
        serve_service("llm-demo", Settings.from_env, start, {})
    assert capsys.readouterr().err == "llm-demo: configuration error: MODEL_ROOT: no checkpoint\n"


def test_other_errors_are_not_swallowed() -> None:
    with pytest.raises(RuntimeError), config_errors_exit("llm-demo"):
        raise RuntimeError("a bug, with its traceback")
