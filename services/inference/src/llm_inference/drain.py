"""Graceful drain: once a replica is told to stop it takes no new requests, says so in every
load report at once, lets running generations finish within the grace period, and hands the
rest back (finish ERROR, which the router resumes elsewhere) before the period ends."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

# Generations still running this long before the grace period ends are handed back, so their
# final message goes out before the server cancels the streams.
HANDBACK_MARGIN_S = 1.0


class Drain:
    """A replica's drain state, shared by Generate, WatchLoad and the server's stop."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._changed = asyncio.Event()  # set on each change; waiters re-arm it
        self.draining = False
        self.done = False  # every generation ended: long-lived streams may end too
        self.handed_back: set[str] = set()  # engine ids ended by the drain

    def notify(self) -> None:
        """Something changed (the drain started or ended, a generation ended): wake waiters."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def pause(self, interval_s: float) -> None:
        """Sleep `interval_s`, waking early on the next notify()."""
        changed = self._changed
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), interval_s)

    async def run(
        self,
        grace_s: float,
        running: Callable[[], list[str]],
        hand_back: Callable[[str], None],
    ) -> None:
        """Drain: wait for `running()` to empty, handing back what is left near the end."""
        self.draining = True
        self.notify()
        deadline = self._clock() + max(grace_s - HANDBACK_MARGIN_S, 0.0)
        await self._idle(running, deadline)
        for engine_id in running():
            self.handed_back.add(engine_id)
            hand_back(engine_id)
        await self._idle(running, deadline + HANDBACK_MARGIN_S)  # their last messages go out
        self.done = True
        self.notify()

    async def _idle(self, running: Callable[[], list[str]], until: float) -> None:
        """Wait until nothing runs (woken by notify()) or the clock reaches `until`."""
        while running() and (left := until - self._clock()) > 0:
            await self.pause(left)
