"""Per-tenant data keys: created on a tenant's first store, kept in Redis only wrapped by the
master key, unwrapped keys held in memory (bounded, with a TTL) so that a hit costs one
AES-GCM decryption and no key round trip.

Per tenant T (`<prefix>{<tenant tag>}:`, the tenant's slot):
  T dek   hash   "active" -> id (hex) of the key new values use; "k:<id>" -> wrapped key
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import redis.asyncio as aioredis
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from llm_cache.envelope import (
    DataKey,
    MasterKeyProvider,
    SealError,
    WrappedKey,
    dek_context,
    new_data_key,
)

ACTIVE = "active"
# KEYS[1] = T dek; ARGV: new id (hex), its wrapped key, replace ('1': rotation).
# Returns {active id, its wrapped key}: the existing one unless replacing, so that replicas
# storing a new tenant's first entries at once agree on one key.
ENSURE_ACTIVE = """
local active = redis.call('HGET', KEYS[1], 'active')
if active and ARGV[3] ~= '1' then
  return {active, redis.call('HGET', KEYS[1], 'k:' .. active)}
end
redis.call('HSET', KEYS[1], 'k:' .. ARGV[1], ARGV[2], 'active', ARGV[1])
return {ARGV[1], ARGV[2]}
"""


@dataclass(frozen=True, slots=True)
class DataKeySettings:
    """How many unwrapped keys a replica holds, and for how long (a rotated or shredded key
    is noticed by other replicas within the TTL)."""

    cache_size: int = 10_000
    ttl_s: float = 60.0


@dataclass(slots=True)
class _Held:
    key: DataKey
    until: float


class DataKeys:
    """The data keys of every tenant, by tenant tag."""

    def __init__(
        self,
        client: aioredis.Redis,
        key_prefix: str,
        provider: MasterKeyProvider,
        settings: DataKeySettings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._prefix = key_prefix
        self._provider = provider
        self._settings = settings or DataKeySettings()
        self._clock = clock
        self._held: OrderedDict[tuple[str, bytes], _Held] = OrderedDict()
        self._active: dict[str, _Held] = {}
        self._ensure = client.register_script(ENSURE_ACTIVE)

    @property
    def provider(self) -> MasterKeyProvider:
        return self._provider

    @property
    def client(self) -> aioredis.Redis:
        return self._client

    def hash_key(self, tag: str) -> str:
        return f"{self._prefix}{{{tag}}}:dek"

    async def active(self, tag: str) -> DataKey:
        """The key new values of the tenant are sealed with (created on first use)."""
        held = self._active.get(tag)
        if held is not None and held.until > self._clock():
            return held.key
        return await self._install(tag, replace=False)

    async def rotate(self, tag: str) -> DataKey:
        """A new active key for the tenant; values sealed with older keys still open."""
        return await self._install(tag, replace=True)

    async def get(self, tag: str, dek_id: bytes) -> DataKey | None:
        """The tenant's key `dek_id`; None when it does not exist (shredded). SealError when
        its wrapping does not open (unknown master key, wrong tenant)."""
        now = self._clock()
        held = self._held.get((tag, dek_id))
        if held is not None and held.until > now:
            self._held.move_to_end((tag, dek_id))
            return held.key
        raw = await self._client.hget(self.hash_key(tag), f"k:{dek_id.hex()}")
        if raw is None:
            self._held.pop((tag, dek_id), None)
            return None
        key = await self._unwrap(tag, dek_id, WrappedKey.decode(raw))
        self._hold(key)
        return key

    async def rewrap(self, tag: str) -> int:
        """Wrap every key of the tenant with the active master key; returns how many changed."""
        name = self.hash_key(tag)
        fields = await self._client.hgetall(name)
        changed = 0
        for field, raw in fields.items():
            label = field.decode() if isinstance(field, bytes) else str(field)
            if not label.startswith("k:"):
                continue
            wrapped = WrappedKey.decode(raw)
            if wrapped.kek_id == self._provider.active_id:
                continue
            context = dek_context(tag, bytes.fromhex(label[2:]))
            dek = await self._provider.unwrap(wrapped, context)
            fresh = await self._provider.wrap(dek, context)
            # Only if still there: a tenant forgotten meanwhile must stay forgotten.
            if await self._client.hexists(name, label):
                await self._client.hset(name, label, fresh.encode())
                changed += 1
        return changed

    async def destroy(self, tag: str) -> None:
        """Delete the tenant's keys (crypto-shredding what they sealed) and forget them here."""
        await self._client.delete(self.hash_key(tag))
        self.drop_cached(tag)

    def drop_cached(self, tag: str) -> None:
        self._active.pop(tag, None)
        for held in [k for k in self._held if k[0] == tag]:
            del self._held[held]

    async def _install(self, tag: str, *, replace: bool) -> DataKey:
        key, raw = new_data_key(tag)
        wrapped = await self._provider.wrap(raw, dek_context(tag, key.dek_id))
        reply = await self._ensure(
            keys=[self.hash_key(tag)],
            args=[key.dek_id.hex(), wrapped.encode(), "1" if replace else "0"],
        )
        active_id, active_raw = reply
        dek_id = bytes.fromhex(active_id.decode() if isinstance(active_id, bytes) else active_id)
        if dek_id != key.dek_id:  # another replica created the tenant's key first
            key = await self._unwrap(tag, dek_id, WrappedKey.decode(active_raw))
        held = self._hold(key)
        self._active[tag] = held
        return key

    async def _unwrap(self, tag: str, dek_id: bytes, wrapped: WrappedKey) -> DataKey:
        raw = await self._provider.unwrap(wrapped, dek_context(tag, dek_id))
        if len(raw) != 32:
            raise SealError("data key of the wrong size")
        return DataKey(tag, dek_id, AESGCM(raw))

    def _hold(self, key: DataKey) -> _Held:
        held = _Held(key, self._clock() + self._settings.ttl_s)
        self._held[(key.tag, key.dek_id)] = held
        self._held.move_to_end((key.tag, key.dek_id))
        while len(self._held) > self._settings.cache_size:
            self._held.popitem(last=False)
        return held
