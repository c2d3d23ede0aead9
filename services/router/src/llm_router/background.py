"""Background tasks that outlive the request (settlement, cache stores), drained at shutdown."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from llm_common.deadlines import without_deadline


class Background:
    """Runs coroutines detached from the request: without its deadline (a cancelled or
    timed-out request is still settled) but with its request id for logs and tracing."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro, context=without_deadline())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def __len__(self) -> int:
        return len(self._tasks)

    async def drain(self, timeout_s: float) -> None:
        """Wait (at most `timeout_s`) for the tasks in flight."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout_s)
