"""ChangeFeed: each read of the change log fanned out to the WatchChanges streams, every
stream with a bounded queue of its own."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from llm_cache.changes import Change
from llm_cache.config import FeedSettings
from llm_cache.metrics import CacheMetrics
from llm_common.errors import QuotaExceeded, QuotaViolation, ServiceError, Unavailable

# The longest gap between two messages while the feed is healthy: the follower reads at
# least this often (changes.READ_BLOCK_MS is below it).
HEARTBEAT_INTERVAL_MS = 1000
MAX_IDS_PER_MESSAGE = 1024
RETRY_AFTER_S = 1.0

# Ids of entries that changed; empty: a heartbeat or, as a stream's first message, "live".
Message = tuple[str, ...]
# Builds the error that ends a stream (one per stream: an exception is raised in one task).
ErrorFactory = Callable[[], ServiceError]


@dataclass(frozen=True, slots=True)
class _End:
    error: ServiceError | None  # None: a clean end (the service is stopping)


class Subscription:
    """One stream's messages; iteration ends (or raises the error) when the feed ends it."""

    def __init__(self, max_pending: int) -> None:
        self._queue: asyncio.Queue[Message | _End] = asyncio.Queue(max_pending)

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Message:
        item = await self._queue.get()
        if isinstance(item, _End):
            if item.error is not None:
                raise item.error
            raise StopAsyncIteration
        return item

    def offer(self, message: Message) -> bool:
        """Queue a message; False when the reader is max_pending messages behind."""
        try:
            self._queue.put_nowait(message)
        except asyncio.QueueFull:
            return False
        return True

    def end(self, error: ServiceError | None) -> None:
        """What is still queued is dropped: the reader must drop its copies anyway."""
        while not self._queue.empty():
            self._queue.get_nowait()
        self._queue.put_nowait(_End(error))


class ChangeFeed:
    """Fans the change log out to subscribers (it is a ChangeListener).

    A new subscriber's first message is empty and means "live": sent at once while the
    follower reads the log, else after its next successful read. Then one message per read:
    the ids that changed (deduplicated, at most MAX_IDS_PER_MESSAGE per message) or, when
    none did, an empty heartbeat. A failed read ends every stream with UNAVAILABLE, and so
    does falling `max_pending` messages behind; stopping ends them cleanly.
    """

    def __init__(self, settings: FeedSettings, metrics: CacheMetrics) -> None:
        self._settings = settings
        self._metrics = metrics
        self._subscribers: set[Subscription] = set()
        self._live = False
        self._closed = False

    @property
    def live(self) -> bool:
        return self._live

    def __len__(self) -> int:
        return len(self._subscribers)

    @contextlib.contextmanager
    def subscribe(self) -> Iterator[Subscription]:
        """A subscription for one stream, removed when the block exits. QuotaExceeded past
        `max_subscribers`; Unavailable once the feed is closed."""
        subscription = self._add()
        try:
            yield subscription
        finally:
            self._subscribers.discard(subscription)
            self._metrics.feed_subscribers.set(len(self._subscribers))

    def deliver(self, entry_ids: Iterable[str]) -> None:
        """One successful read of the log: its changed ids, or a heartbeat."""
        messages = _split(entry_ids, MAX_IDS_PER_MESSAGE)
        if not self._live:
            self._live = True
            self._broadcast(())  # "live" to the subscribers that waited for it
            if not messages:
                return
        for message in messages or [()]:
            self._broadcast(message)

    def close(self) -> None:
        """The service is stopping: end every stream cleanly, take no new ones."""
        self._closed = True
        self._live = False
        self._end_all(None, "shutdown")

    async def changed(self, changes: Sequence[Change]) -> None:
        self.deliver(entry_id for change in changes for entry_id in change.entry_ids)

    def interrupted(self) -> None:
        """The log cannot be read: nothing kept anywhere can be trusted any more. This
        also ends the streams still waiting for their first message."""
        self._live = False
        self._end_all(_interrupted, "store_unavailable")

    def _add(self) -> Subscription:
        if self._closed:
            raise Unavailable("cache replica shutting down", retry_after_s=RETRY_AFTER_S)
        limit = self._settings.max_subscribers
        if len(self._subscribers) >= limit:
            violation = QuotaViolation(
                "WatchChanges", f"at most {limit} concurrent streams per cache replica"
            )
            raise QuotaExceeded([violation], retry_after_s=RETRY_AFTER_S)
        subscription = Subscription(self._settings.max_pending)
        if self._live:
            subscription.offer(())
        self._subscribers.add(subscription)
        self._metrics.feed_subscribers.set(len(self._subscribers))
        return subscription

    def _broadcast(self, message: Message) -> None:
        behind = [s for s in self._subscribers if not s.offer(message)]
        self._end(behind, _fell_behind, "fell_behind")

    def _end_all(self, error: ErrorFactory | None, reason: str) -> None:
        self._end(list(self._subscribers), error, reason)

    def _end(self, ended: list[Subscription], error: ErrorFactory | None, reason: str) -> None:
        for subscription in ended:
            subscription.end(error() if error is not None else None)
            self._subscribers.discard(subscription)
        if ended:
            self._metrics.feed_ended.labels(reason).inc(len(ended))
            self._metrics.feed_subscribers.set(len(self._subscribers))


def _interrupted() -> ServiceError:
    return Unavailable(
        "cache change feed interrupted (store unavailable): drop every kept entry",
        retry_after_s=RETRY_AFTER_S,
    )


def _fell_behind() -> ServiceError:
    return Unavailable(
        "fell behind the cache change feed: drop every kept entry", retry_after_s=RETRY_AFTER_S
    )


def _split(entry_ids: Iterable[str], size: int) -> list[Message]:
    """Distinct ids, first occurrence order, in messages of at most `size`."""
    ids = tuple(dict.fromkeys(entry_ids))
    return [ids[i : i + size] for i in range(0, len(ids), size)]
