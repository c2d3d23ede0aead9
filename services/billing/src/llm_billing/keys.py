"""Redis key layout of the ledger; every per-tenant key carries the `{tenant}` hash tag.

Under `<prefix>{<tenant>}:` (one Redis Cluster slot per tenant, so each Lua script touches
one slot):

    rec:<request_id>        hash  the request's reservation and usage record
    open                    zset  request ids of open reservations, scored by expiry (ms)
    recs                    zset  request ids, scored by admission time (ms), for export
    bcfg:<scope>            hash  budget of a scope: period, hard, soft
    bal:<scope>:<period>    hash  sp (spent) and rs (reserved) micros in one period
    uh:<hour> / ud:<day>    hash  usage counters `<metric>|<dimension>` per UTC hour / day
    uout                    stream the usage outbox: final usage of settled, expired and
                                   refunded requests, for the SQL usage store (outbox.py)

Scopes: `t` (the tenant) and `k:<key_id>`; periods: `d<day>`, `m<YYYYMM>`, `all`.
Metrics: n (requests), pt, ct, ch (prompt, completion, cached tokens), c (cost micros).
Dimensions: `t`, `k|<key>`, `m|<model>`, `km|<key>|<model>`.

Global keys: `<prefix>tenants` (set of tenants) and `<prefix>rid:<request_id>` (the
tenant that owns a request id). The Lua scripts in lua/ build the same names.
"""

from __future__ import annotations

from dataclasses import dataclass

METRICS = ("n", "pt", "ct", "ch", "c")


@dataclass(frozen=True, slots=True)
class KeySpace:
    """Key names under one prefix."""

    prefix: str

    def tenant_base(self, tenant: str) -> str:
        """`<prefix>{<tenant>}:`, the start of every key of the tenant."""
        return f"{self.prefix}{{{tenant}}}:"

    def record(self, tenant: str, request_id: str) -> str:
        return f"{self.tenant_base(tenant)}rec:{request_id}"

    def open_reservations(self, tenant: str) -> str:
        return f"{self.tenant_base(tenant)}open"

    def records_by_time(self, tenant: str) -> str:
        return f"{self.tenant_base(tenant)}recs"

    def budget(self, tenant: str, key_id: str) -> str:
        return f"{self.tenant_base(tenant)}bcfg:{scope(key_id)}"

    def balance(self, tenant: str, key_id: str, period_id: str) -> str:
        return f"{self.tenant_base(tenant)}bal:{scope(key_id)}:{period_id}"

    def usage_hour(self, tenant: str, hour: int) -> str:
        return f"{self.tenant_base(tenant)}uh:{hour}"

    def usage_day(self, tenant: str, day: int) -> str:
        return f"{self.tenant_base(tenant)}ud:{day}"

    def usage_outbox(self, tenant: str) -> str:
        return f"{self.tenant_base(tenant)}uout"

    def outbox_lock(self) -> str:
        """Held by the one process that drains the outbox (or reconciles) at a time."""
        return f"{self.prefix}uout-lock"

    def tenants(self) -> str:
        return f"{self.prefix}tenants"

    def request_owner(self, request_id: str) -> str:
        return f"{self.prefix}rid:{request_id}"


def scope(key_id: str) -> str:
    """The budget scope: `t` for the tenant-wide budget, `k:<key>` for a key's."""
    return f"k:{key_id}" if key_id else "t"


def dimension(key_id: str, model: str) -> str:
    """The usage counter dimension matching the filters (empty = not filtered)."""
    if key_id and model:
        return f"km|{key_id}|{model}"
    if key_id:
        return f"k|{key_id}"
    if model:
        return f"m|{model}"
    return "t"


def usage_fields(dim: str) -> list[str]:
    """The counter fields of one dimension, in METRICS order."""
    return [f"{metric}|{dim}" for metric in METRICS]
