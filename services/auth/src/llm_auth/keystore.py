"""API key records in Redis: create, read, list per tenant, revoke and rotate."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

from llm_auth.apikeys import ParsedKey, digest, generate_key
from llm_auth.config import RedisSettings
from llm_auth.keyspace import Keyspace
from llm_auth.principal import KeyLimits
from llm_auth.records import KeyRecord, as_text
from llm_auth.redis_guard import RedisGuard
from llm_common.redis_mux import Command, Pipelined, ReplicaWait, pipelined

# Creating never overwrites: a key id collision (or a bootstrap race) leaves the first record.
_CREATE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV))
return 1
"""
_REVOKE = """
local revoked = redis.call('HGET', KEYS[1], 'revoked_at_ms')
if not revoked then return 0 end
if revoked == '0' then redis.call('HSET', KEYS[1], 'revoked_at_ms', ARGV[1]) end
return 1
"""
# The current digest becomes the previous one, valid until ARGV[3].
_ROTATE = """
local current = redis.call('HGET', KEYS[1], 'digest')
if not current then return 0 end
redis.call('HSET', KEYS[1], 'previous_digest', current, 'previous_expires_at_ms', ARGV[3],
           'digest', ARGV[1], 'secret_hint', ARGV[2])
return 1
"""


Replies = list[Any]  # (KeyStore.list shadows the builtin in its class body)


def key_wait(settings: RedisSettings) -> ReplicaWait | None:
    """The WAIT key writes make (AUTH_REDIS_WAIT_REPLICAS, AUTH_REDIS_WAIT_TIMEOUT_MS)."""
    if settings.wait_replicas <= 0:
        return None
    return ReplicaWait(settings.wait_replicas, settings.wait_timeout_ms)


@dataclass(frozen=True, slots=True)
class _ScriptCall:
    """A registered key-record script with its keys and arguments."""

    script: Any
    keys: list[str]
    args: Sequence[Any]


@dataclass(frozen=True, slots=True)
class NewKey:
    """What an operator asks for when creating a key."""

    tenant_id: str
    name: str = ""
    scopes: tuple[str, ...] = ()
    allowed_models: tuple[str, ...] = ()
    limits: KeyLimits = field(default_factory=KeyLimits)
    labels: Mapping[str, str] = field(default_factory=dict)
    ttl_ms: int = 0  # 0 = never expires


@dataclass(frozen=True, slots=True)
class KeyPage:
    """One page of a tenant's keys; `next_offset` None on the last page."""

    records: tuple[KeyRecord, ...]
    next_offset: int | None


class KeyStore:
    """Key records (`key:{id}` hashes) and each tenant's index (`tenant:{t}:keys`)."""

    def __init__(
        self,
        guard: RedisGuard,
        keyspace: Keyspace,
        pepper: bytes,
        *,
        wait: ReplicaWait | None = None,
    ) -> None:
        self._guard = guard
        self._keys = keyspace
        self._pepper = pepper
        client = guard.client
        self._create = client.register_script(_CREATE)
        self._revoke = client.register_script(_REVOKE)
        self._rotate = client.register_script(_ROTATE)
        self._listeners: list[Callable[[str], None]] = []
        # With `wait`, writes go with a WAIT on the connection that made them (a pool's next
        # connection would wait for nothing): through the mux, one per master.
        self._wait = wait
        self._durable: Pipelined | None = pipelined(client) if wait is not None else None

    async def aclose(self) -> None:
        if self._durable is not None:
            await self._durable.aclose()

    async def create(self, spec: NewKey, now_ms: int) -> tuple[KeyRecord, ParsedKey]:
        """A new key; the returned secret is never stored."""
        key = generate_key()
        record = KeyRecord(
            key_id=key.key_id,
            tenant_id=spec.tenant_id,
            digest=digest(self._pepper, key),
            name=spec.name,
            scopes=spec.scopes,
            allowed_models=spec.allowed_models,
            limits=spec.limits,
            labels=dict(spec.labels),
            secret_hint=key.hint,
            created_at_ms=now_ms,
            expires_at_ms=now_ms + spec.ttl_ms if spec.ttl_ms > 0 else 0,
        )
        if not await self.insert(record):
            raise RuntimeError("key id collision")  # 2^-64 per existing key: not a client error
        return record, key

    async def insert(self, record: KeyRecord) -> bool:
        """Store `record` unless its key id exists; True when stored. The tenant index is
        written either way (NX keeps the first score), so a retry after a failure between the
        two writes completes the index."""
        fields = [item for pair in record.to_redis().items() for item in pair]
        index: Command = [
            "ZADD", self._keys.tenant_keys(record.tenant_id), "NX", record.created_at_ms,
            record.key_id,
        ]  # fmt: skip
        created, _ = await self._write(
            _ScriptCall(self._create, [self._keys.key_record(record.key_id)], fields), index
        )
        return bool(created)

    async def get(self, key_id: str) -> KeyRecord | None:
        """The record of `key_id`, or None."""
        raw = await self._guard.run(self._guard.client.hgetall, self._keys.key_record(key_id))
        return KeyRecord.from_redis(key_id, raw) if raw else None

    async def list(
        self, tenant_id: str, *, offset: int, page_size: int, include_revoked: bool
    ) -> KeyPage:
        """Up to `page_size` records in creation order, starting at index `offset`."""
        records: list[KeyRecord] = []
        index_key = self._keys.tenant_keys(tenant_id)
        while len(records) < page_size:
            ids = await self._guard.run(
                self._guard.client.zrange, index_key, offset, offset + page_size - 1
            )
            if not ids:
                return KeyPage(tuple(records), None)
            for position, raw_id in enumerate(ids):
                record = await self.get(as_text(cast(bytes, raw_id)))
                offset_after = offset + position + 1
                if record is not None and (include_revoked or not record.is_revoked()):
                    records.append(record)
                    if len(records) == page_size:
                        return KeyPage(tuple(records), offset_after)
            offset += len(ids)
        return KeyPage(tuple(records), offset)

    async def revoke(self, key_id: str, now_ms: int) -> KeyRecord | None:
        """Mark the key revoked (idempotent: the first revocation time stays)."""
        call = _ScriptCall(self._revoke, [self._keys.key_record(key_id)], [now_ms])
        (found,) = await self._write(call)
        if not found:
            return None
        await self._announce(key_id)
        return await self.get(key_id)

    async def rotate(
        self, key_id: str, *, grace_ms: int, now_ms: int
    ) -> tuple[KeyRecord, ParsedKey] | None:
        """A new secret for `key_id`; the old one works for `grace_ms` more."""
        key = generate_key(key_id)
        args: Sequence[Any] = [digest(self._pepper, key), key.hint, now_ms + grace_ms]
        call = _ScriptCall(self._rotate, [self._keys.key_record(key_id)], args)
        (found,) = await self._write(call)
        if not found:
            return None
        await self._announce(key_id)
        record = await self.get(key_id)
        return None if record is None else (record, key)

    async def forget_tenant(self, tenant_id: str) -> int:
        """Delete every key record of the tenant, its index and its rate-limit state (buckets,
        reservations, leases); returns how many key records went. Each key is announced, so
        every replica's cache drops it at once."""
        client, index_key = self._guard.client, self._keys.tenant_keys(tenant_id)
        found = await self._guard.run(client.zrange, index_key, 0, -1)
        ids = [as_text(cast(bytes, i)) for i in found]
        deleted = 0
        for key_id in ids:
            deleted += int(await self._guard.run(client.delete, self._keys.key_record(key_id)))
            await self._announce(key_id)
        await self._guard.run(client.delete, index_key)
        pattern = self._keys.bucket(tenant_id, "*")
        names = [n async for n in client.scan_iter(match=pattern, count=500)]
        for start in range(0, len(names), 500):
            await self._guard.run(client.delete, *names[start : start + 500])
        return deleted

    def on_change(self, listener: Callable[[str], None]) -> None:
        """Call `listener(key_id)` in this process whenever this store revokes or rotates."""
        self._listeners.append(listener)

    async def _write(self, call: _ScriptCall, *more: Command) -> Replies:
        """A key-record script (then `more` commands), acknowledged once `wait` replicas
        have them when set. Every write here is idempotent (create is NX, revoke keeps the
        first time, rotate sets the same values): a caller may retry after any failure."""
        if self._durable is None:
            replies = [await self._guard.run(call.script, keys=call.keys, args=call.args)]
            for command in more:
                replies.append(await self._guard.run(self._guard.client.execute_command, *command))
            return replies
        return await self._guard.run(self._durably, call, more)

    async def _durably(self, call: _ScriptCall, more: Sequence[Command]) -> Replies:
        assert self._durable is not None
        # Loaded first, every time (key writes are rare): a NOSCRIPT reply would hide behind
        # the WAIT's error, and the write would never be retried with the script loaded.
        call.script.sha = await self._guard.client.script_load(call.script.script)
        evalsha: Command = ["EVALSHA", call.script.sha, len(call.keys), *call.keys, *call.args]
        replies = await self._durable.execute([evalsha, *more], wait=self._wait)
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies

    async def _announce(self, key_id: str) -> None:
        # Local caches forget the key at once; other replicas hear it on the channel.
        for listener in self._listeners:
            listener(key_id)
        await self._guard.run(self._guard.client.publish, self._keys.key_events(), key_id)


def with_digest_of(record: KeyRecord, pepper: bytes, key: ParsedKey) -> KeyRecord:
    """`record` storing the digest of `key` (used to seed a configured bootstrap key)."""
    return replace(record, key_id=key.key_id, digest=digest(pepper, key), secret_hint=key.hint)
