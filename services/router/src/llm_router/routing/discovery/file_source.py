"""File discovery: one host:port per line of a file, re-read every interval; what a local
stack's `make scale` rewrites as it starts and stops replicas."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from llm_common.logging import get_logger
from llm_common.models_config import Discovery

_log = get_logger(__name__)


class FileSource:
    """Addresses listed in `discovery.path` (blank lines and # comments ignored); a file that
    cannot be read keeps the last set, so a rewrite in progress never empties the fleet."""

    def __init__(self, discovery: Discovery) -> None:
        self._path = Path(discovery.path)
        self._interval_s = discovery.interval_s
        self._last: frozenset[str] | None = None
        self._due = 0.0

    async def next(self, timeout_s: float) -> frozenset[str] | None:
        wait = self._due - time.monotonic()
        if wait > timeout_s:
            await asyncio.sleep(timeout_s)
            return None
        await asyncio.sleep(max(wait, 0.0))
        self._due = time.monotonic() + self._interval_s
        found = self._read()
        if found is None or found == self._last:
            return None
        self._last = found
        return found

    def close(self) -> None:
        """Nothing held open between reads."""

    def _read(self) -> frozenset[str] | None:
        try:
            text = self._path.read_text(encoding="utf-8")
        except OSError as err:
            _log.warning("replica file unreadable", path=str(self._path), error=str(err))
            return None
        lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
        return frozenset(line for line in lines if line)
