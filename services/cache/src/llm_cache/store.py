"""Redis storage of cache entries behind a circuit breaker: every failure is StoreUnavailable."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from llm_cache import scripts
from llm_cache.canonical import model_tag, tenant_tag
from llm_cache.config import Policy, RedisSettings
from llm_cache.sealing import EntrySealer
from llm_common.redis_mux import Pipelined, eval_script, pipelined
from llm_common.resilience import AsyncBreaker, BreakerOpen

P = ParamSpec("P")
T = TypeVar("T")
# Redis bookkeeping per entry outside its hash (sz field, lru/exp/model-set members, hash and
# key headers), counted into the byte budget so that it bounds memory, not just payload.
ENTRY_OVERHEAD_BYTES = 256
_BATCH = 500  # ids per invalidation step: long scripts would stall every other client
_READ_SCRIPTS = ("GET_EXACT", "GET_SEMANTIC")  # the scripts sent on the hot connection


class StoreUnavailable(Exception):  # noqa: N818 - reads as a state
    """Redis is down, slow or the breaker is open; the operation did not happen."""


@dataclass(frozen=True, slots=True)
class NewEntry:
    """An entry to write: the serialized response and what the semantic index needs."""

    entry_id: str
    model: str
    namespace: str
    response: bytes
    created_ms: int
    ttl_s: int
    vector: bytes | None = None  # float32, unit length; None: exact-only entry
    semantic_text: str | None = None

    def fields(self) -> list[bytes | str]:
        """Hash field/value pairs, flattened."""
        pairs: list[bytes | str] = ["r", self.response, "c", str(self.created_ms)]
        pairs += ["ns", self.namespace]
        if self.vector is not None and self.semantic_text is not None:
            pairs += ["v", self.vector, "s", self.semantic_text]
        return pairs

    def size(self, key_bytes: int) -> int:
        """Accounted bytes: payload, key name and the fixed bookkeeping overhead."""
        return accounted_size(self.fields(), key_bytes)


def accounted_size(fields: Sequence[bytes | str], key_bytes: int) -> int:
    payload = sum(len(f.encode("utf-8") if isinstance(f, str) else f) for f in fields)
    return payload + key_bytes + ENTRY_OVERHEAD_BYTES


@dataclass(frozen=True, slots=True)
class Hit:
    """A stored response found by id."""

    entry_id: str
    response: bytes
    created_ms: int
    expires_ms: int = 0  # wall clock; 0: unknown


@dataclass(frozen=True, slots=True)
class SemanticFetch:
    """The first servable candidate, and the ids that turned out gone or blocked."""

    hit: Hit | None
    missing: tuple[str, ...]
    blocked: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PutResult:
    evicted: tuple[str, ...]
    expired: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Usage:
    entries: int
    bytes: int
    expired: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class IndexedEntry:
    """What the semantic index needs from a stored entry (start-up rebuild, replica sync)."""

    entry_id: str
    namespace: str
    vector: bytes
    semantic_text: str


@dataclass(frozen=True, slots=True)
class TenantKeys:
    """Key names of one tenant; all share the `{tag}` hash tag."""

    prefix: str  # "<key prefix>{<tag>}:"

    @property
    def tag(self) -> str:
        return self.prefix[self.prefix.index("{") + 1 : self.prefix.index("}")]

    def entry(self, entry_id: str) -> str:
        return f"{self.prefix}e:{entry_id}"

    def model(self, model: str) -> str:
        return f"{self.prefix}m:{model_tag(model)}"

    @property
    def lru(self) -> str:
        return f"{self.prefix}lru"  # accounting[1], without building the other three

    @property
    def accounting(self) -> list[str]:
        """KEYS[1..4] of the scripts: sz, lru, exp, bytes."""
        return [f"{self.prefix}{name}" for name in ("sz", "lru", "exp", "bytes")]

    @property
    def blocked(self) -> str:
        return f"{self.prefix}blk"

    @property
    def all_fixed(self) -> list[str]:
        """The tenant's keys other than entries and model sets (emptied as entries go)."""
        return [*self.accounting, self.blocked]


class RedisStore:
    """Entries of all tenants in one Redis (or Cluster); each call is one round trip.

    All calls go through `breaker`: while it is open they fail at once with
    StoreUnavailable instead of waiting for timeouts. The lookups' reads (get_exact,
    get_semantic) travel on `hot` (default: llm_common's auto-pipelined RedisMux on the
    client's endpoint), which costs a fraction of redis-py's CPU per call; everything else
    uses the client's pool.

    With a `sealer`, responses, embeddings and prompt texts are stored encrypted with the
    tenant's data key (sealing.py); a value that does not open reads as absent.
    """

    def __init__(
        self,
        client: aioredis.Redis,
        settings: RedisSettings,
        policy: Policy,
        breaker: AsyncBreaker,
        *,
        clock: Callable[[], float] = time.time,
        hot: Pipelined | None = None,
        sealer: EntrySealer | None = None,
    ) -> None:
        self._client = client
        self.sealer = sealer
        self._hot = hot if hot is not None else pipelined(client, decode=False)
        self._settings = settings
        self._policy = policy
        self._breaker = breaker
        self._clock = clock
        self._scripts = {
            name: client.register_script(getattr(scripts, name))
            for name in (
                "STORE",
                "GET_EXACT",
                "GET_SEMANTIC",
                "REMOVE",
                "INVALIDATE_MODEL",
                "INVALIDATE_TENANT",
                "FEEDBACK",
                "USAGE",
            )
        }
        self._known_tenants: set[str] = set()

    async def aclose(self) -> None:
        """Close the lookups' connection (the redis-py client is closed by its owner)."""
        await self._hot.aclose()

    @property
    def tenants_key(self) -> str:
        return f"{self._settings.key_prefix}tenants"

    def keys(self, tenant: str) -> TenantKeys:
        return self.keys_for_tag(tenant_tag(tenant))

    def keys_for_tag(self, tag: str) -> TenantKeys:
        return TenantKeys(f"{self._settings.key_prefix}{{{tag}}}:")

    async def get_exact(self, tenant: str, entry_id: str) -> Hit | None:
        k = self.keys(tenant)
        now = self._now_ms()
        reply = await self._read("GET_EXACT", [k.entry(entry_id), k.lru], [entry_id, now])
        if not reply:
            return None
        response = await self._open(k, entry_id, "r", reply[0])
        if response is None:
            return None
        return Hit(entry_id, response, int(reply[1] or 0), _expiry(now, reply[2]))

    async def get_semantic(
        self, tenant: str, query_digest: str, candidates: Sequence[str]
    ) -> SemanticFetch:
        k = self.keys(tenant)
        now = self._now_ms()
        args: list[str | int] = [k.prefix, now, query_digest, *candidates]
        found, response, created, missing, blocked, ttl = await self._read(
            "GET_SEMANTIC", [k.lru, k.blocked], args
        )
        gone, hit = _ids(missing), None
        if found:
            entry_id = _text(found)
            opened = await self._open(k, entry_id, "r", response)
            if opened is None:  # unreadable: as good as gone
                gone = (*gone, entry_id)
            else:
                hit = Hit(entry_id, opened, int(created or 0), _expiry(now, ttl))
        return SemanticFetch(hit, gone, _ids(blocked))

    async def put(self, tenant: str, entry: NewEntry) -> PutResult:
        k = self.keys(tenant)
        fields = entry.fields()
        if self.sealer is not None:
            fields = await self._sealing(self.sealer.seal_fields, k.tag, entry.entry_id, fields)
        size = accounted_size(fields, len(k.entry(entry.entry_id)))
        args = [
            k.prefix,
            entry.entry_id,
            entry.created_ms,
            entry.ttl_s * 1000,
            size,
            self._policy.tenant_budget_bytes,
            model_tag(entry.model),
            *fields,
        ]
        evicted, expired = await self._run("STORE", k.accounting, args)
        await self._remember_tenant(tenant)
        return PutResult(_ids(evicted), _ids(expired))

    async def remove(self, tenant: str, entry_ids: Sequence[str]) -> int:
        k = self.keys(tenant)
        removed: int = await self._run("REMOVE", k.accounting, [k.prefix, *entry_ids])
        return removed

    async def invalidate_model(self, tenant: str, model: str) -> list[str]:
        k = self.keys(tenant)
        return await self._drain("INVALIDATE_MODEL", [*k.accounting, k.model(model)], k.prefix)

    async def invalidate_tenant(self, tenant: str) -> list[str]:
        k = self.keys(tenant)
        return await self._drain("INVALIDATE_TENANT", k.accounting, k.prefix)

    async def forget_tenant(self, tenant: str) -> list[str]:
        """Remove everything of the tenant: entries, Feedback blocks, accounting, its data
        keys (crypto-shredding copies of its values elsewhere) and its place in the tenant
        set. Returns the ids of the entries removed."""
        k = self.keys(tenant)
        removed = await self.invalidate_tenant(tenant)
        await self._call(self._client.delete, *k.all_fixed)
        if self.sealer is not None:
            await self._sealing(self.sealer.keys.destroy, k.tag)
        await self._call(self._client.srem, self.tenants_key, k.tag)
        self._known_tenants.discard(k.tag)
        return removed

    async def feedback(self, tenant: str, entry_id: str, query_digest: str | None) -> bool:
        """Remove the entry; block (query, entry) for the configured time when given."""
        k = self.keys(tenant)
        now = self._now_ms()
        member = f"{query_digest}:{entry_id}" if query_digest else ""
        until = now + self._policy.feedback_block_s * 1000
        args = [k.prefix, entry_id, member, until, now, self._policy.max_blocked_pairs]
        existed = await self._run("FEEDBACK", [*k.accounting, k.blocked], args)
        return bool(existed)

    async def usage_for_tag(self, tag: str) -> Usage:
        k = self.keys_for_tag(tag)
        entries, used, expired = await self._run("USAGE", k.accounting, [k.prefix, self._now_ms()])
        return Usage(int(entries), int(used), _ids(expired))

    async def touch(self, used: Mapping[str, Collection[str]]) -> None:
        """Mark entries (ids by tenant) used now for the LRU, in one round trip. Ids that
        are gone are skipped (ZADD XX)."""
        await self._call(self._touch, used, self._now_ms())

    async def append_log(
        self, stream: str, events: Sequence[Mapping[str, str]], max_len: int
    ) -> None:
        """Append events to the replicas' change log in one round trip, trimmed to about
        `max_len` events."""
        await self._call(self._append, stream, events, max_len)

    async def tenant_tags(self) -> list[str]:
        members = await self._call(self._client.smembers, self.tenants_key)
        return sorted(_text(m) for m in members)

    async def scan_indexed(self, tag: str) -> AsyncIterator[list[IndexedEntry]]:
        """Every entry of a tenant that carries a vector, in batches (start-up rebuild).
        Not under the breaker: the caller retries the whole rebuild."""
        k = self.keys_for_tag(tag)
        sizes_key = k.accounting[0]
        cursor: int = 0
        while True:
            cursor, batch = await self._client.hscan(sizes_key, cursor, count=_BATCH)
            ids = [_text(i) for i in batch]
            if ids:
                yield await self.fetch_indexed(k, ids)
            if cursor == 0:
                return

    async def fetch_indexed(self, k: TenantKeys, ids: Sequence[str]) -> list[IndexedEntry]:
        """The vectors and texts of `ids` (those that still exist and carry one)."""
        async with self._client.pipeline(transaction=False) as pipe:
            for entry_id in ids:
                pipe.hmget(k.entry(entry_id), "ns", "v", "s")
            rows = await pipe.execute()
        found = []
        for entry_id, (ns, vector, text) in zip(ids, rows, strict=True):
            if ns is None or vector is None or text is None:
                continue
            vector = await self._open(k, entry_id, "v", vector)
            text = await self._open(k, entry_id, "s", text)
            if vector is not None and text is not None:
                found.append(IndexedEntry(entry_id, _text(ns), vector, _text(text)))
        return found

    async def _open(self, k: TenantKeys, entry_id: str, field: str, value: bytes) -> bytes | None:
        """A stored value in the clear (as stored when unsealed); None when it does not open."""
        if self.sealer is None:
            return value
        return await self._sealing(self.sealer.open, k.tag, entry_id, field, value)

    async def _sealing(self, fn: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs) -> T:
        """A data key operation: Redis trouble is StoreUnavailable. Not under the breaker:
        held keys make it a dictionary look-up on the hot path, without a Redis call."""
        try:
            return await fn(*args, **kwargs)
        except (TimeoutError, RedisError, OSError) as exc:
            raise StoreUnavailable(type(exc).__name__) from exc

    async def _touch(self, used: Mapping[str, Collection[str]], now: int) -> None:
        async with self._client.pipeline(transaction=False) as pipe:
            for tenant, ids in used.items():
                if ids:
                    pipe.zadd(self.keys(tenant).lru, dict.fromkeys(ids, now), xx=True)
            await pipe.execute()

    async def _append(self, stream: str, events: Sequence[Mapping[str, str]], max_len: int) -> None:
        async with self._client.pipeline(transaction=False) as pipe:
            for fields in events:
                pipe.xadd(stream, dict(fields), maxlen=max_len, approximate=True)  # type: ignore[arg-type]
            await pipe.execute()

    async def _drain(self, script: str, keys: list[str], prefix: str) -> list[str]:
        removed: list[str] = []
        while batch := _ids(await self._run(script, keys, [prefix, _BATCH])):
            removed.extend(batch)
        return removed

    async def _remember_tenant(self, tenant: str) -> None:
        # The tenant set lives outside the tenant's slot, so it is written separately (once
        # per tenant and process); it is only read to rebuild the index and for admin stats.
        tag = tenant_tag(tenant)
        if tag not in self._known_tenants:
            await self._call(self._client.sadd, self.tenants_key, tag)
            self._known_tenants.add(tag)

    async def _run(self, name: str, keys: list[str], args: list[Any]) -> Any:
        script = self._scripts[name]
        return await self._call(script, keys=keys, args=args)

    async def _read(self, name: str, keys: list[str], args: list[str | int]) -> Any:
        try:
            return await self._call(self._evalsha, name, keys, args)
        except StoreUnavailable as exc:
            if isinstance(exc.__cause__, RedisConnectionError):
                await self._drop_idle_pooled()
            raise

    async def _drop_idle_pooled(self) -> None:
        """Redis went away under the lookups' connection, so the pool's idle connections
        are dead too, and (no retries) the next call on each would fail and count against
        the breaker. Before lookups had their own connection, their failures cleared them."""
        with contextlib.suppress(RedisError, OSError):
            await self._client.connection_pool.disconnect(inuse_connections=False)

    async def _evalsha(self, name: str, keys: list[str], args: list[str | int]) -> Any:
        """One script on `hot`, within the same timeout as a pooled call (the mux's own
        watchdog only notices a hung Redis up to half a timeout later). Not sent again after
        a lost connection: as on the pool, there are no client retries; the breaker decides."""
        sha = self._scripts[name].sha
        async with asyncio.timeout(self._settings.timeout_s):
            return await eval_script(self._hot, sha, keys, args, self._load_read_scripts)

    async def _load_read_scripts(self) -> None:
        """After NOSCRIPT (Redis restarted or flushed its scripts)."""
        for name in _READ_SCRIPTS:
            await self._client.script_load(self._scripts[name].script)

    async def _call(self, fn: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await self._breaker.call(fn, *args, **kwargs)
        except BreakerOpen as exc:
            raise StoreUnavailable("circuit breaker open") from exc
        except (TimeoutError, RedisError, OSError) as exc:
            raise StoreUnavailable(type(exc).__name__) from exc

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)


def _expiry(now_ms: int, ttl_ms: int | bytes | None) -> int:
    """The wall-clock expiry from a PTTL reply; 0 when unknown (no expiry, or gone)."""
    ttl = int(ttl_ms or 0)
    return now_ms + ttl if ttl > 0 else 0


def _ids(values: Sequence[bytes | str] | None) -> tuple[str, ...]:
    return tuple(_text(v) for v in values or ())


def _text(value: bytes | str) -> str:
    # The client does not decode replies; str only appears in the type stubs' union.
    return value.decode() if isinstance(value, bytes) else value
