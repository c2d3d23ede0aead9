"""Downstream settings: the services the router calls, their deadlines, breakers and
batching."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Self

from llm_common.config import ConfigError, env_bool, env_float, env_int, env_str
from llm_router.clients.batching import MAX_BATCH_ITEMS

# A settle waits at most this long for others to share its SettleBatch call.
MAX_BATCH_WAIT_MS = 1000.0
MAX_BATCHES_IN_FLIGHT = 64
_DISABLED = frozenset({"off", "none", "disabled"})


@dataclass(frozen=True, slots=True)
class DownstreamSettings:
    """Addresses of the services the router calls and how it treats their failures."""

    tokenizer_addr: str
    billing_addr: str
    auth_addr: str | None = None  # None: no tokens-per-minute quota (AUTH_SERVICE_ADDR=off)
    cache_addr: str | None = None  # None: no response cache (CACHE_SERVICE_ADDR=off)
    call_timeout_s: float = 5.0  # each unary downstream call, capped by the caller's deadline
    request_timeout_s: float = 300.0  # whole request when the caller sent no deadline
    settle_timeout_s: float = 5.0  # settlement calls, which outlive the caller's deadline
    # Settlements share SettleBatch calls: one goes out at once while fewer than
    # `settle_batch_in_flight` are in flight; otherwise when this many are queued, when one in
    # flight returns, or `settle_batch_wait_ms` after the first. 0: one call each.
    settle_batch_max: int = 64
    settle_batch_wait_ms: float = 2.0
    settle_batch_in_flight: int = 1  # 0: every batch waits for the size or the time
    # Even with room in flight a settlement waits this long before it goes: the answer's last
    # message and the RPC's status leave first, instead of sharing the cores with the
    # settlement's call (the caller sees its stream end that much sooner). 0: at once.
    settle_batch_linger_ms: float = 2.0
    # Reserve calls share ReserveBatch calls by the same rule (a lone admission goes out at
    # once as a unary Reserve; under load the batches keep billing's calls in flight few, which
    # is what keeps its tail short). The wait is short: admission is on the request's path.
    # 0: one Reserve call each.
    reserve_batch_max: int = 64
    reserve_batch_wait_ms: float = 1.0
    reserve_batch_in_flight: int = 1
    breaker_fail_max: int = 5
    breaker_reset_s: float = 10.0
    quota_fail_open: bool = True  # admit when auth's token quota cannot be checked
    # A key auth reported unlimited skips ReserveTokens/RefundTokens this long (a limit set
    # meanwhile applies when it expires); 0: ask auth on every request.
    quota_unlimited_ttl_s: float = 30.0
    # A tenant, key and model billing reported unbudgeted skip Reserve this long and settle
    # without a reservation (a budget set meanwhile is enforced when it expires); 0: always
    # reserve. Short: budgets are money.
    billing_unbudgeted_ttl_s: float = 5.0
    # gRPC's own retry of UNAVAILABLE on the tokenizer/auth/billing/cache channels. Turn it off
    # when those addresses are an Envoy mesh listener, which already retries: never the same
    # hop at two layers.
    channel_retries: bool = True
    # Start generation while quota and budget are being reserved; nothing is released to the
    # caller until admission succeeds, and a refusal cancels the generation.
    overlap_admission: bool = True
    # While hits are common, how long generation waits for the cache lookup before starting
    # anyway (cancelled on a hit): bounds what a slow cache adds to a miss. Generous, because
    # a lookup slower than the grace makes every hit cost a replica prefill it then drops.
    lookup_grace_s: float = 0.05
    # Below this recent hit rate generation starts before the lookup answers (a hit cancels
    # it): the replica's wasted prefill on rare hits is cheaper than the grace on every miss.
    speculate_below_hit_rate: float = 0.2

    def __post_init__(self) -> None:
        for name in ("call_timeout_s", "request_timeout_s", "settle_timeout_s", "breaker_reset_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0:
                raise ConfigError.for_variable(f"ROUTER_{name.upper()}", "must be > 0")
        if not 0.0 <= self.speculate_below_hit_rate <= 1.0:
            raise ConfigError.for_variable("ROUTER_SPECULATE_BELOW_HIT_RATE", "must be in [0, 1]")
        if self.breaker_fail_max < 1:
            raise ConfigError.for_variable("ROUTER_BREAKER_FAIL_MAX", "must be >= 1")
        for kind in ("settle", "reserve"):
            _check_batch(
                kind,
                getattr(self, f"{kind}_batch_max"),
                getattr(self, f"{kind}_batch_wait_ms"),
                getattr(self, f"{kind}_batch_in_flight"),
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Self:
        d = cls(tokenizer_addr="-", billing_addr="-")
        return cls(
            tokenizer_addr=env_str(environ, "TOKENIZER_SERVICE_ADDR", required=True),
            billing_addr=env_str(environ, "BILLING_SERVICE_ADDR", required=True),
            auth_addr=_optional_addr(environ, "AUTH_SERVICE_ADDR"),
            cache_addr=_optional_addr(environ, "CACHE_SERVICE_ADDR"),
            call_timeout_s=env_float(environ, "ROUTER_CALL_TIMEOUT_S", d.call_timeout_s),
            request_timeout_s=env_float(environ, "ROUTER_REQUEST_TIMEOUT_S", d.request_timeout_s),
            settle_timeout_s=env_float(environ, "ROUTER_SETTLE_TIMEOUT_S", d.settle_timeout_s),
            settle_batch_max=env_int(environ, "ROUTER_SETTLE_BATCH_MAX", d.settle_batch_max),
            settle_batch_wait_ms=env_float(
                environ, "ROUTER_SETTLE_BATCH_WAIT_MS", d.settle_batch_wait_ms, min_value=0.0
            ),
            settle_batch_in_flight=env_int(
                environ, "ROUTER_SETTLE_BATCH_IN_FLIGHT", d.settle_batch_in_flight
            ),
            settle_batch_linger_ms=env_float(
                environ,
                "ROUTER_SETTLE_BATCH_LINGER_MS",
                d.settle_batch_linger_ms,
                min_value=0.0,
                max_value=MAX_BATCH_WAIT_MS,
            ),
            reserve_batch_max=env_int(environ, "ROUTER_RESERVE_BATCH_MAX", d.reserve_batch_max),
            reserve_batch_wait_ms=env_float(
                environ, "ROUTER_RESERVE_BATCH_WAIT_MS", d.reserve_batch_wait_ms, min_value=0.0
            ),
            reserve_batch_in_flight=env_int(
                environ, "ROUTER_RESERVE_BATCH_IN_FLIGHT", d.reserve_batch_in_flight
            ),
            breaker_fail_max=env_int(environ, "ROUTER_BREAKER_FAIL_MAX", d.breaker_fail_max),
            breaker_reset_s=env_float(environ, "ROUTER_BREAKER_RESET_S", d.breaker_reset_s),
            quota_fail_open=env_bool(environ, "ROUTER_QUOTA_FAIL_OPEN", d.quota_fail_open),
            quota_unlimited_ttl_s=env_float(
                environ, "ROUTER_QUOTA_UNLIMITED_TTL_S", d.quota_unlimited_ttl_s, min_value=0.0
            ),
            billing_unbudgeted_ttl_s=env_float(
                environ,
                "ROUTER_BILLING_UNBUDGETED_TTL_S",
                d.billing_unbudgeted_ttl_s,
                min_value=0.0,
            ),
            channel_retries=env_bool(environ, "ROUTER_CHANNEL_RETRIES", d.channel_retries),
            overlap_admission=env_bool(environ, "ROUTER_OVERLAP_ADMISSION", d.overlap_admission),
            lookup_grace_s=env_float(
                environ, "ROUTER_LOOKUP_GRACE_S", d.lookup_grace_s, min_value=0.0
            ),
            speculate_below_hit_rate=env_float(
                environ, "ROUTER_SPECULATE_BELOW_HIT_RATE", d.speculate_below_hit_rate
            ),
        )


def _check_batch(kind: str, max_items: int, wait_ms: float, in_flight: int) -> None:
    """ROUTER_{SETTLE,RESERVE}_BATCH_*: the shape of a CallBatcher."""
    prefix = f"ROUTER_{kind.upper()}_BATCH"
    if not 0 <= max_items <= MAX_BATCH_ITEMS:
        raise ConfigError.for_variable(
            f"{prefix}_MAX", f"must be in 0..{MAX_BATCH_ITEMS} (0: no batching)"
        )
    if not 0 <= in_flight <= MAX_BATCHES_IN_FLIGHT:
        raise ConfigError.for_variable(
            f"{prefix}_IN_FLIGHT", f"must be in 0..{MAX_BATCHES_IN_FLIGHT}"
        )
    if not 0.0 <= wait_ms <= MAX_BATCH_WAIT_MS:
        raise ConfigError.for_variable(f"{prefix}_WAIT_MS", f"must be in 0..{MAX_BATCH_WAIT_MS:g}")


def _optional_addr(environ: Mapping[str, str], name: str) -> str | None:
    # Required unless explicitly switched off, so a forgotten variable fails start-up.
    value = env_str(environ, name, required=True)
    return None if value.lower() in _DISABLED else value
