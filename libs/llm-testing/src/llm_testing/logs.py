"""Captured JSON log lines of the library's logging, for assertions."""

from __future__ import annotations

import contextlib
import io
import json
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import structlog

from llm_common.logging import configure_logging

if TYPE_CHECKING:
    pass


class LogCapture:
    """JSON log lines written through `configure_logging` while capturing."""

    def __init__(self) -> None:
        self.stream = io.StringIO()

    @property
    def text(self) -> str:
        return self.stream.getvalue()

    def records(self) -> list[dict[str, Any]]:
        """Every line, parsed."""
        return [json.loads(line) for line in self.text.splitlines()]

    def events(self, event: str) -> list[dict[str, Any]]:
        """The lines whose `event` is `event`."""
        return [record for record in self.records() if record.get("event") == event]


@contextlib.contextmanager
def captured_logs(service_name: str = "test", level: str = "DEBUG") -> Iterator[LogCapture]:
    """Configure logging into a buffer; the previous stdlib and structlog setup is restored."""
    root = logging.getLogger()
    handlers, root_level = root.handlers[:], root.level
    capture = LogCapture()
    configure_logging(service_name, level, stream=capture.stream)
    try:
        yield capture
    finally:
        root.handlers, root.level = handlers, root_level
        structlog.reset_defaults()
