"""Redis key names. Rate-limit state carries a `{tenant}` hash tag, so each Lua script touches
one Redis Cluster slot; a key record is tagged by its own key id."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Keyspace:
    """Key names under one prefix (validated in config to contain no braces)."""

    prefix: str

    def key_record(self, key_id: str) -> str:
        return f"{self.prefix}key:{{{key_id}}}"

    def tenant_keys(self, tenant_id: str) -> str:
        """Sorted set of a tenant's key ids, scored by creation time."""
        return f"{self.prefix}tenant:{{{tenant_id}}}:keys"

    def bucket(self, tenant_id: str, name: str) -> str:
        """A token bucket (`req:key:<id>`, `tok:tenant`, ...)."""
        return f"{self.prefix}rl:{{{tenant_id}}}:{name}"

    def reservation(self, tenant_id: str, reservation_id: str) -> str:
        return f"{self.prefix}rl:{{{tenant_id}}}:rsv:{reservation_id}"

    def leases(self, tenant_id: str, key_id: str) -> str:
        """Sorted set of a key's concurrency leases, scored by expiry."""
        return f"{self.prefix}rl:{{{tenant_id}}}:conc:{key_id}"

    def key_events(self) -> str:
        """Pub/sub channel announcing revoked or rotated key ids to every replica."""
        return f"{self.prefix}key-events"
