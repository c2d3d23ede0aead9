"""Routing settings: replica selection, failover, load reporting, token grouping."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Self

from llm_common.config import ConfigError, env_float, env_int, env_str

BALANCERS = ("expected_wait", "round_robin")
# The replica's limits on token grouping (inference_service.proto, Delivery).
MAX_TOKENS_PER_MESSAGE = 4096
MAX_HOLD_MS = 60_000


@dataclass(frozen=True, slots=True)
class RoutingSettings:
    """Replica selection, failover and load reporting."""

    balancer: str = "expected_wait"  # or round_robin (the baseline)
    region: str = "local"  # this router's region; preferred when the caller names none
    region_header: str = "x-llm-region"  # comma-separated preferred regions, first wins
    block_tokens: int = 16  # prompt tokens per prefix-affinity block
    max_prefix_blocks: int = 64  # leading blocks hashed for affinity
    affinity_entries: int = 65536  # remembered block hashes (LRU)
    affinity_ttl_s: float = 600.0
    prefill_weight: float = 1.0  # cost of a prompt token relative to a generated token
    imbalance_abs: int = 16  # in-flight requests: max - min above this ...
    imbalance_rel: float = 1.5  # ... and max > min * this → ignore affinity
    exclude_s: float = 5.0  # a failed replica sits out this long, doubling per failure
    exclude_max_s: float = 60.0
    dispatch_attempts: int = 3  # replicas tried before the first token
    # A replica that sends nothing this long after Generate started (a frozen process, a
    # stalled host) is treated as failed: the request goes to another one. Generous, because
    # a busy replica's queue is a legitimate wait; 0 = wait for the caller's deadline.
    first_token_timeout_s: float = 30.0
    retry_base_s: float = 0.02
    retry_cap_s: float = 1.0
    retry_jitter_s: float = 0.05
    load_interval_ms: int = 200  # WatchLoad report interval
    load_stale_s: float = 5.0  # older reports count as unknown load
    mesh_addr: str | None = None  # send inference calls through this Envoy listener
    mesh_header: str = "x-envoy-original-dst-host"  # names the replica for ORIGINAL_DST
    # Replicas group tokens into fewer messages (each costs every hop a wake-up): streamed
    # answers up to `tokens_per_message`, none held past `max_hold_ms` (only while the replica
    # is faster than that); unary answers up to `unary_tokens_per_message`. 1 = each token.
    tokens_per_message: int = 4
    max_hold_ms: int = 10
    unary_tokens_per_message: int = 64
    # A stream ended early (cancel, content filter) is stopped on its replica and read to its
    # last message, which counts the tokens generated; after this long it is cancelled instead.
    stop_timeout_s: float = 1.0

    def __post_init__(self) -> None:
        if self.balancer not in BALANCERS:
            raise ConfigError.for_variable("ROUTER_BALANCER", f"must be one of {BALANCERS}")
        for name in (
            "block_tokens",
            "max_prefix_blocks",
            "affinity_entries",
            "dispatch_attempts",
            "tokens_per_message",
            "unary_tokens_per_message",
        ):
            if getattr(self, name) < 1:
                raise ConfigError.for_variable(_routing_variable(name), "must be >= 1")
        if not 50 <= self.load_interval_ms <= 60_000:
            raise ConfigError.for_variable("ROUTER_LOAD_INTERVAL_MS", "must be in 50..60000")
        for name in ("tokens_per_message", "unary_tokens_per_message"):
            if getattr(self, name) > MAX_TOKENS_PER_MESSAGE:
                raise ConfigError.for_variable(
                    _routing_variable(name), f"must be <= {MAX_TOKENS_PER_MESSAGE}"
                )
        if self.max_hold_ms > MAX_HOLD_MS:
            raise ConfigError.for_variable("ROUTER_MAX_HOLD_MS", f"must be <= {MAX_HOLD_MS}")
        if self.imbalance_rel < 1.0 or self.imbalance_abs < 0:
            raise ConfigError.for_variable(
                "ROUTER_IMBALANCE_REL", "must be >= 1 (and ROUTER_IMBALANCE_ABS >= 0)"
            )
        if self.exclude_max_s < self.exclude_s:
            raise ConfigError.for_variable("ROUTER_EXCLUDE_MAX_S", "must be >= ROUTER_EXCLUDE_S")
        if not self.region or not self.region_header or not self.mesh_header:
            raise ConfigError.for_variable("ROUTER_REGION", "region and header names must be set")

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Self:
        d = cls()

        def f(name: str) -> float:
            return env_float(environ, _routing_variable(name), getattr(d, name), min_value=0.0)

        def i(name: str) -> int:
            return env_int(environ, _routing_variable(name), getattr(d, name), min_value=0)

        return cls(
            balancer=env_str(environ, "ROUTER_BALANCER", d.balancer).lower(),
            region=env_str(environ, "ROUTER_REGION", d.region),
            region_header=env_str(environ, "ROUTER_REGION_HEADER", d.region_header).lower(),
            block_tokens=i("block_tokens"),
            max_prefix_blocks=i("max_prefix_blocks"),
            affinity_entries=i("affinity_entries"),
            affinity_ttl_s=f("affinity_ttl_s"),
            prefill_weight=f("prefill_weight"),
            imbalance_abs=i("imbalance_abs"),
            imbalance_rel=f("imbalance_rel"),
            exclude_s=f("exclude_s"),
            exclude_max_s=f("exclude_max_s"),
            dispatch_attempts=i("dispatch_attempts"),
            first_token_timeout_s=f("first_token_timeout_s"),
            retry_base_s=f("retry_base_s"),
            retry_cap_s=f("retry_cap_s"),
            retry_jitter_s=f("retry_jitter_s"),
            load_interval_ms=i("load_interval_ms"),
            load_stale_s=f("load_stale_s"),
            tokens_per_message=i("tokens_per_message"),
            max_hold_ms=i("max_hold_ms"),
            unary_tokens_per_message=i("unary_tokens_per_message"),
            stop_timeout_s=f("stop_timeout_s"),
            mesh_addr=env_str(environ, "INFERENCE_MESH_ADDR"),
            mesh_header=env_str(environ, "INFERENCE_MESH_HEADER", d.mesh_header).lower(),
        )


def _routing_variable(name: str) -> str:
    return f"ROUTER_{name.upper()}"
