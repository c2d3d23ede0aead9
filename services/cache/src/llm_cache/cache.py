"""ResponseCache: the exact and semantic lookup, store, invalidation and feedback rules."""

from __future__ import annotations

import contextlib
import enum
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from llm_cache import guard
from llm_cache.canonical import RequestKey, pair_digest, tenant_tag
from llm_cache.changes import ADD, DROP, PUT, ChangeLog
from llm_cache.config import Policy, SemanticSettings
from llm_cache.index import Candidate, Vector
from llm_cache.metrics import CacheMetrics
from llm_cache.semantic import Embedding, IndexItem, SemanticEngine
from llm_cache.stats import Counters, Stats
from llm_cache.store import Hit, NewEntry, RedisStore, StoreUnavailable
from llm_cache.sync import IndexSync
from llm_common.errors import Unavailable
from llm_common.logging import get_logger

RETRY_AFTER_S = 1.0
_log = get_logger(__name__)


class Kind(enum.Enum):
    EXACT = "exact"
    SEMANTIC = "semantic"
    MISS = "miss"


class Reason(enum.StrEnum):
    """Why a lookup missed or a store did not happen."""

    NOT_FOUND = "not_found"
    NONDETERMINISTIC = "nondeterministic"
    UNCACHEABLE = "uncacheable"
    STORE_UNAVAILABLE = "store_unavailable"
    FEEDBACK_BLOCKED = "feedback_blocked"
    SEMANTIC_UNAVAILABLE = "semantic_unavailable"
    TOO_LARGE = "too_large"
    INCOMPLETE = "incomplete"


@dataclass(frozen=True, slots=True)
class LookupOptions:
    semantic: bool = False
    threshold: float | None = None  # None: the service default
    allow_nondeterministic: bool = False


@dataclass(frozen=True, slots=True)
class LookupResult:
    kind: Kind
    similarity: float = 0.0
    hit: Hit | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class StoreOptions:
    ttl_s: int = 0  # 0: the default TTL
    allow_nondeterministic: bool = False
    semantic_index: bool = True
    complete: bool = True  # False: cancelled, failed or filtered responses are not kept


@dataclass(frozen=True, slots=True)
class StoreOutcome:
    stored: bool
    entry_id: str
    reason: str = ""
    evicted: int = 0


@dataclass(frozen=True, slots=True)
class FeedbackOutcome:
    removed: bool
    pair_blocked: bool


@dataclass(frozen=True, slots=True)
class Forgotten:
    entries: int
    keys_destroyed: bool


@dataclass(frozen=True, slots=True)
class NearHits:
    """Exact hits of one entry that a caller served from its own copy."""

    tenant: str
    entry_id: str
    count: int


@dataclass(frozen=True, slots=True)
class StatsView:
    counters: Counters
    entries: int
    bytes: int
    store_available: bool
    indexed_vectors: int
    index_ready: bool


def _miss(reason: str) -> LookupResult:
    return LookupResult(Kind.MISS, reason=reason)


class ResponseCache:
    """Exact lookups by request digest; semantic lookups by embedding within the request's
    namespace, filtered by the guard and by Feedback blocks, then read back from Redis.

    Every store and removal is published to the change log (for the other replicas'
    indexes and for callers keeping copies). Lookup, Store and RecordHits never raise for an
    unavailable store: Lookup misses, Store drops (counted), RecordHits only counts.
    Invalidate and Feedback raise Unavailable then, since silently skipping them would leave
    wrong answers in place.
    """

    def __init__(
        self,
        store: RedisStore,
        engine: SemanticEngine | None,
        changes: ChangeLog,
        sync: IndexSync | None,
        *,
        semantic: SemanticSettings,
        policy: Policy,
        stats: Stats,
        metrics: CacheMetrics,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._engine = engine
        self._changes = changes
        self._sync = sync
        self._semantic = semantic
        self._policy = policy
        self._stats = stats
        self._metrics = metrics
        self._clock = clock
        self._lookups = {kind: metrics.lookups.labels(kind.value) for kind in Kind}  # hot path

    async def lookup(self, key: RequestKey, options: LookupOptions) -> LookupResult:
        result = await self._lookup(key, options)
        kind = result.kind
        self._stats.record(
            key.tenant,
            Counters(
                lookups=1,
                exact_hits=int(kind is Kind.EXACT),
                semantic_hits=int(kind is Kind.SEMANTIC),
                misses=int(kind is Kind.MISS),
            ),
        )
        self._lookups[kind].inc()
        if kind is Kind.MISS:
            self._metrics.misses.labels(result.reason).inc()
        return result

    async def store(self, key: RequestKey, response: bytes, options: StoreOptions) -> StoreOutcome:
        refused = self._refusal(key, options.allow_nondeterministic)
        if refused is None and not options.complete:
            refused = Reason.INCOMPLETE
        if refused is not None:
            return self._store_outcome(key, StoreOutcome(False, key.entry_id, refused))
        embedding = await self._embedding_for_store(key, options.semantic_index)
        vector = embedding.vector if embedding is not None else None
        entry = NewEntry(
            entry_id=key.entry_id,
            model=key.model,
            namespace=key.namespace,
            response=response,
            created_ms=int(self._clock() * 1000),
            ttl_s=options.ttl_s or self._policy.default_ttl_s,
            vector=vector.tobytes() if vector is not None else None,
            semantic_text=key.semantic_text if vector is not None else None,
        )
        if entry.size(0) > self._policy.max_entry_bytes:
            return self._store_outcome(key, StoreOutcome(False, key.entry_id, Reason.TOO_LARGE))
        try:
            put = await self._store.put(key.tenant, entry)
        except StoreUnavailable:
            return self._store_outcome(
                key, StoreOutcome(False, key.entry_id, Reason.STORE_UNAVAILABLE)
            )
        await self._forget(tenant_tag(key.tenant), [*put.evicted, *put.expired])
        await self._announce_stored(key, vector)
        return self._store_outcome(key, StoreOutcome(True, key.entry_id, evicted=len(put.evicted)))

    async def invalidate(self, tenant: str, *, entry_id: str = "", model: str = "") -> int:
        """Remove one entry, a model's entries, or all of the tenant's; returns the count."""
        try:
            if entry_id:
                removed = await self._store.remove(tenant, [entry_id])
                ids = [entry_id]
            else:
                ids = await (
                    self._store.invalidate_model(tenant, model)
                    if model
                    else self._store.invalidate_tenant(tenant)
                )
                removed = len(ids)
        except StoreUnavailable as exc:
            raise Unavailable("cache store unavailable", retry_after_s=RETRY_AFTER_S) from exc
        await self._forget(tenant_tag(tenant), ids)
        return removed

    async def feedback(self, tenant: str, entry_id: str, key: RequestKey | None) -> FeedbackOutcome:
        """Remove a wrongly served entry; with the request's key, also block that (query,
        entry) pair for CACHE_FEEDBACK_BLOCK_S, even if the entry is stored again."""
        query = None
        if key is not None and key.semantic_text is not None:
            query = pair_digest(key.namespace, key.semantic_text)
        try:
            removed = await self._store.feedback(tenant, entry_id, query)
        except StoreUnavailable as exc:
            raise Unavailable("cache store unavailable", retry_after_s=RETRY_AFTER_S) from exc
        await self._forget(tenant_tag(tenant), [entry_id])
        return FeedbackOutcome(removed=removed, pair_blocked=query is not None)

    async def forget_tenant(self, tenant: str) -> Forgotten:
        """Erase everything the cache holds of `tenant` (its data keys included), here and
        in every replica's index and caller's copies (the change log)."""
        try:
            ids = await self._store.forget_tenant(tenant)
        except StoreUnavailable as exc:
            raise Unavailable("cache store unavailable", retry_after_s=RETRY_AFTER_S) from exc
        await self._forget(tenant_tag(tenant), ids)
        return Forgotten(entries=len(ids), keys_destroyed=self._store.sealer is not None)

    async def stats(self, tenant: str | None) -> StatsView:
        """Counters since start; entries and bytes from Redis (all tenants when None)."""
        counters = self._stats.snapshot(tenant)
        indexed = self._engine.indexed if self._engine is not None else 0
        ready = self._sync is not None and self._sync.ready.is_set()
        try:
            tags = await self._store.tenant_tags() if tenant is None else [tenant_tag(tenant)]
            usages = [await self._store.usage_for_tag(tag) for tag in tags]
        except StoreUnavailable:
            return StatsView(counters, 0, 0, False, indexed, ready)
        for tag, usage in zip(tags, usages, strict=True):
            await self._forget(tag, usage.expired)
        entries = sum(u.entries for u in usages)
        used = sum(u.bytes for u in usages)
        return StatsView(counters, entries, used, True, indexed, ready)

    async def record_hits(self, hits: Sequence[NearHits]) -> int:
        """Account hits that callers served from their own copies as the exact lookups
        they replace: in stats and metrics, and as recent use for the LRU (best effort: an
        unavailable store costs only the recency). Returns how many were accounted."""
        used: dict[str, set[str]] = {}
        for hit in hits:
            n = hit.count
            self._stats.record(hit.tenant, Counters(lookups=n, exact_hits=n, near_hits=n))
            used.setdefault(hit.tenant, set()).add(hit.entry_id)
        total = sum(hit.count for hit in hits)
        self._lookups[Kind.EXACT].inc(total)
        self._metrics.near_hits.inc(total)
        if used:
            with contextlib.suppress(StoreUnavailable):  # the entries only age a bit sooner
                await self._store.touch(used)
        return total

    async def _lookup(self, key: RequestKey, options: LookupOptions) -> LookupResult:
        refused = self._refusal(key, options.allow_nondeterministic)
        if refused is not None:
            return _miss(refused)
        try:
            hit = await self._store.get_exact(key.tenant, key.entry_id)
        except StoreUnavailable:
            return _miss(Reason.STORE_UNAVAILABLE)
        if hit is not None:
            return LookupResult(Kind.EXACT, 1.0, hit)
        if not (options.semantic and self._semantic.enabled) or self._engine is None:
            return _miss(Reason.NOT_FOUND)
        if key.semantic_text is None:
            return _miss(Reason.NOT_FOUND)
        return await self._lookup_semantic(key, options.threshold or self._semantic.threshold)

    async def _lookup_semantic(self, key: RequestKey, threshold: float) -> LookupResult:
        assert self._engine is not None
        assert key.semantic_text is not None
        floor, verify = self._search_floor(key.tenant, threshold)
        try:
            search = await self._engine.search(
                key.namespace, key.semantic_text, self._semantic.candidates, floor, verify
            )
        except Exception:  # the encoder must never fail a request: degrade to a miss
            _log.exception("semantic search failed")
            return _miss(Reason.SEMANTIC_UNAVAILABLE)
        if search is None:
            return _miss(Reason.NOT_FOUND)
        passing, rejection = self._guarded(
            search.embedding, search.candidates, key.tenant, threshold
        )
        if not passing:
            return _miss(f"guard_{rejection}" if rejection else Reason.NOT_FOUND)
        query = pair_digest(key.namespace, key.semantic_text)
        try:
            fetch = await self._store.get_semantic(key.tenant, query, [c.entry_id for c in passing])
        except StoreUnavailable:
            return _miss(Reason.STORE_UNAVAILABLE)
        await self._engine.remove(fetch.missing)  # expired or removed by another replica
        if fetch.hit is None:
            return _miss(Reason.FEEDBACK_BLOCKED if fetch.blocked else Reason.NOT_FOUND)
        similarity = next(c.similarity for c in passing if c.entry_id == fetch.hit.entry_id)
        return LookupResult(Kind.SEMANTIC, similarity, fetch.hit)

    def _search_floor(self, tenant: str, threshold: float) -> tuple[float, int]:
        """The similarity the search starts at and how many candidates the verifier scores:
        a verifier mode proposes from the threshold plus its margin (below the threshold
        when the margin is negative: the verifier decides), the rule guard from the
        threshold with nothing scored."""
        mode = self._semantic.verifier_mode(tenant)
        verifier = self._engine.verifier if self._engine is not None else None
        if mode == "off" or verifier is None or not self._semantic.guard:
            return threshold, 0
        floor = threshold + verifier.point(mode).similarity_margin
        return max(0.0, floor), self._semantic.verifier_candidates

    def _guarded(
        self,
        embedding: Embedding,
        candidates: Iterable[Candidate],
        tenant: str,
        threshold: float,
    ) -> tuple[list[Candidate], str | None]:
        """The candidates the guard (or the verifier) lets through, and the first
        rejection's check."""
        if not self._semantic.guard:
            return list(candidates), None
        passing, first = [], None
        mode = self._semantic.verifier_mode(tenant)
        for candidate in candidates:
            if mode != "off" and candidate.verified is not None:
                mismatch = self._verified(embedding, candidate, mode, threshold)
            elif mode != "off" and self._engine is not None and self._engine.verifier is not None:
                continue  # past the nearest few the verifier scores: never served
            else:
                mismatch = self._rules(embedding, candidate, threshold)
            if mismatch is None:
                passing.append(candidate)
                continue
            first = first or mismatch.value
            self._metrics.guard_rejections.labels(mismatch.value).inc()
            self._stats.record(tenant, Counters(guard_rejections=1))
        return passing, first

    def _rules(
        self, embedding: Embedding, candidate: Candidate, threshold: float
    ) -> guard.Mismatch | None:
        """The rule guard alone (verifier off or not loaded)."""
        needed = guard.required_similarity(
            embedding.features, candidate.features, threshold, self._semantic.question_margin
        )
        if candidate.similarity < needed:
            return guard.Mismatch.SIMILARITY
        return guard.check(embedding.features, candidate.features)

    def _verified(
        self, embedding: Embedding, candidate: Candidate, mode: str, threshold: float
    ) -> guard.Mismatch | None:
        """The mode's operating point (similarity, then the verifier's probability), after
        the rule checks kept next to the verifier."""
        assert self._engine is not None
        assert self._engine.verifier is not None
        assert candidate.verified is not None
        point = self._engine.verifier.point(mode)
        if candidate.similarity < threshold + point.similarity_margin:
            return guard.Mismatch.SIMILARITY
        mismatch = guard.check_with_verifier(embedding.features, candidate.features)
        if mismatch is None and candidate.verified < point.probability:
            return guard.Mismatch.VERIFIER
        return mismatch

    def _refusal(self, key: RequestKey, allow_nondeterministic: bool) -> Reason | None:
        if not key.replayable:
            return Reason.UNCACHEABLE
        if not (key.deterministic or allow_nondeterministic):
            return Reason.NONDETERMINISTIC
        return None

    async def _embedding_for_store(self, key: RequestKey, wanted: bool) -> Embedding | None:
        if not (wanted and self._semantic.enabled) or self._engine is None:
            return None
        if key.semantic_text is None:
            return None
        try:
            return await self._engine.embed(key.semantic_text)
        except Exception:  # store the entry for exact hits anyway
            _log.exception("embedding for store failed")
            return None

    async def _announce_stored(self, key: RequestKey, vector: Vector | None) -> None:
        """Index the new content here, then tell everyone that the id changed (the other
        replicas re-read it for their indexes)."""
        op = PUT
        if self._engine is not None:
            if vector is not None and key.semantic_text is not None:
                item = IndexItem(key.namespace, key.entry_id, vector, key.semantic_text)
                if await self._engine.put([item]):
                    op = ADD
                else:
                    self._metrics.index_full.inc()
            elif key.entry_id in self._engine:  # the entry it replaced had a vector
                await self._engine.remove([key.entry_id])
            self._metrics.index_vectors.set(self._engine.indexed)
        await self._changes.publish(tenant_tag(key.tenant), op, [key.entry_id])

    async def _forget(self, tag: str, entry_ids: Sequence[str]) -> None:
        """Drop removed ids from this index and tell everyone."""
        if not entry_ids:
            return
        if self._engine is not None:
            await self._engine.remove(entry_ids)
            self._metrics.index_vectors.set(self._engine.indexed)
        await self._changes.publish(tag, DROP, entry_ids)

    def _store_outcome(self, key: RequestKey, outcome: StoreOutcome) -> StoreOutcome:
        dropped = outcome.reason == Reason.STORE_UNAVAILABLE
        self._stats.record(
            key.tenant,
            Counters(
                stores=int(outcome.stored),
                dropped_stores=int(dropped),
                evictions=outcome.evicted,
            ),
        )
        label = "stored" if outcome.stored else "dropped" if dropped else "refused"
        self._metrics.stores.labels(label).inc()
        self._metrics.evictions.inc(outcome.evicted)
        return outcome
