"""Revocations reach every replica at once: a Redis pub/sub subscriber that evicts cached keys."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import redis.asyncio
from redis.exceptions import RedisError

from llm_auth.records import as_text
from llm_common.logging import get_logger
from llm_common.redis_conn import ensure_ready
from llm_common.resilience import Backoff

_BACKOFF = Backoff(base=0.2, cap=5.0, jitter=0.2)
_POLL_S = 1.0
_STOP_TIMEOUT_S = 2.0
_log = get_logger(__name__)


class KeyEventSubscriber:
    """Listens on the key-events channel; calls `forget(key_id)` for each announcement and
    `resync()` after every (re)subscription, because announcements made meanwhile are lost."""

    def __init__(
        self,
        client: redis.asyncio.Redis,
        channel: str,
        forget: Callable[[str], None],
        resync: Callable[[], None],
    ) -> None:
        self._client = client
        self._channel = channel
        self._forget = forget
        self._resync = resync
        self._task: asyncio.Task[None] | None = None
        self.subscribed = asyncio.Event()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="key-events")

    async def stop(self) -> None:
        """Cancel the subscription; a dead connection must not hold up the shutdown."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task}, timeout=_STOP_TIMEOUT_S)

    async def _run(self) -> None:
        failures = 0
        while True:
            try:
                await self._listen()
            except (RedisError, OSError) as exc:
                failures = 1 if self.subscribed.is_set() else failures + 1
                self.subscribed.clear()
                self._resync()  # deaf to announcements now: stop trusting cached keys
                _log.warning("key events subscription lost", error=type(exc).__name__)
                await asyncio.sleep(_BACKOFF.delay(min(failures, 10)))

    async def _listen(self) -> None:
        await ensure_ready(self._client, refresh=True)  # a cluster's pub/sub needs its slot map
        pubsub = self._client.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(self._channel)
            self._resync()
            self.subscribed.set()
            while True:
                message = await pubsub.get_message(timeout=_POLL_S)
                if message is not None and message.get("type") == "message":
                    self._forget(as_text(message["data"]))
        finally:
            await pubsub.aclose()  # type: ignore[no-untyped-call]
