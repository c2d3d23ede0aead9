"""WatchLoad subscriptions: one stream per inference replica feeding the LoadBoard,
reconnected with jittered backoff when it breaks; replicas discovered later are added and
removed while it runs."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence

import grpc

from llm_common.logging import get_logger
from llm_common.resilience import Backoff
from llm_router.clients.inference import InferenceClient
from llm_router.routing.load import LoadBoard
from llm_router.routing.selection import ReplicaSelector

_log = get_logger(__name__)


class LoadWatcher:
    """Keeps a WatchLoad stream open to every replica."""

    def __init__(
        self,
        inference: InferenceClient,
        board: LoadBoard,
        selector: ReplicaSelector,
        replicas: Sequence[str],
        *,
        interval_ms: int,
        backoff: Backoff | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._inference = inference
        self._board = board
        self._selector = selector
        self._replicas = list(replicas)
        self._interval_ms = interval_ms
        self._backoff = backoff or Backoff(base=0.2, cap=5.0, jitter=0.2)
        self._rng = rng or random.Random()
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def start(self) -> None:
        for replica in self._replicas:
            self.watch(replica)

    def watch(self, replica: str) -> None:
        """Open (and keep open) `replica`'s load stream, unless it is already watched."""
        if replica not in self._tasks:
            self._tasks[replica] = asyncio.get_running_loop().create_task(self._watch(replica))

    def unwatch(self, replica: str) -> None:
        """Close `replica`'s load stream (it left its deployment)."""
        task = self._tasks.pop(replica, None)
        if task is not None:
            task.cancel()
            self._board.lost(replica)

    async def stop(self) -> None:
        tasks, self._tasks = list(self._tasks.values()), {}
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _watch(self, replica: str) -> None:
        failures, was_connected = 0, False
        while True:
            try:
                async for snapshot in self._inference.watch_load(replica, self._interval_ms):
                    if not was_connected and failures:
                        # Back after an outage: it may have restarted with a cold prefix cache.
                        self._selector.forget(replica)
                    was_connected, failures = True, 0
                    self._board.report(replica, snapshot)
            except grpc.aio.AioRpcError as err:
                # Logged once per outage, not on every reconnect attempt.
                log = _log.warning if was_connected else _log.debug
                log("load stream broke", replica=replica, code=err.code().name)
            self._board.lost(replica)
            was_connected = False
            failures += 1
            await asyncio.sleep(self._backoff.delay(min(failures, 16), self._rng))
