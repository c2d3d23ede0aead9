"""Process entry points: a configuration error is one line and exit code 2, never a traceback."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable, Coroutine, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar

from llm_common.config import ConfigError, ServerSettings
from llm_common.logging import configure_logging

EXIT_CONFIG_ERROR = 2


class HasServerSettings(Protocol):
    """A service's settings: whatever else they hold, they carry the generic server part."""

    @property
    def server(self) -> ServerSettings: ...


S = TypeVar("S", bound=HasServerSettings)


@contextmanager
def config_errors_exit(program: str) -> Iterator[None]:
    """Turn ConfigError into `<program>: configuration error: …` on stderr and exit code 2."""
    try:
        yield
    except ConfigError as exc:
        print(f"{program}: configuration error: {exc}", file=sys.stderr)
        sys.exit(EXIT_CONFIG_ERROR)
    except KeyboardInterrupt:
        pass  # SIGINT before the service installed its signal handlers (e.g. while loading)


def serve_service(
    program: str,
    load_settings: Callable[[Mapping[str, str]], S],
    start: Callable[[S], Coroutine[Any, Any, None]],
    environ: Mapping[str, str] | None = None,
) -> None:
    """Read settings, configure logging, then run `start(settings)` until it returns.

    `start` should import the service's server module itself, so that import errors (torch,
    model code) are logged as JSON by the logging configured here.
    """
    with config_errors_exit(program):
        settings = load_settings(os.environ if environ is None else environ)
        configure_logging(settings.server.service_name, settings.server.log_level)
        asyncio.run(start(settings))
