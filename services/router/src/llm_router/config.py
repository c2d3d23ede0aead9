"""Router settings, read from the environment once in __main__ (tests pass dicts)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Self

from llm_common.config import (
    MIB,
    ConfigError,
    ServerSettings,
    env_bool,
    env_float,
    env_int,
    env_optional_port,
    env_str,
)
from llm_router.attestation import AttestationSettings
from llm_router.batching import MAX_BATCH_ITEMS
from llm_router.local_tokenizer import TokenizeMode
from llm_router.near_cache import NearCacheSettings
from llm_router.quota_lease import LeaseSettings
from llm_router.token_memo import MemoSettings

SERVICE_NAME = "router"
DEFAULT_GRPC_PORT = 50053
DEFAULT_METRICS_PORT = 9153
DEFAULT_MODELS_CONFIG = "infra/config/models.yaml"
DEFAULT_POLICIES_CONFIG = "infra/config/policies.yaml"
DEFAULT_MODEL_ROOT = ".cache/models"
DEFAULT_OUTBOX_DIR = ".cache/router-outbox"
# A settle waits at most this long for others to share its SettleBatch call.
MAX_BATCH_WAIT_MS = 1000.0
MAX_BATCHES_IN_FLIGHT = 64
# The replica's limits on token grouping (inference_service.proto, Delivery).
MAX_TOKENS_PER_MESSAGE = 4096
MAX_HOLD_MS = 60_000
_DISABLED = frozenset({"off", "none", "disabled"})
BALANCERS = ("expected_wait", "round_robin")


@dataclass(frozen=True, slots=True)
class Limits:
    """Request size limits; every one is checked before any downstream call."""

    max_request_bytes: int = 2 * MIB  # serialized request
    max_messages: int = 512
    max_content_bytes: int = MIB  # all message contents together (the tokenizer's limit)
    max_prompt_bytes: int = MIB
    max_name_bytes: int = 64
    max_stop_strings: int = 16
    max_stop_bytes: int = 256
    max_stop_token_ids: int = 64
    max_top_k: int = 1000
    max_metadata_pairs: int = 16
    max_metadata_key_bytes: int = 64
    max_metadata_value_bytes: int = 256
    max_user_bytes: int = 256
    max_embed_inputs: int = 256
    max_embed_input_bytes: int = 64 * 1024
    max_tools: int = 128
    max_schema_bytes: int = 64 * 1024  # a JSON schema, regex or grammar (and each tool's)

    def __post_init__(self) -> None:
        for f in fields(self):
            if getattr(self, f.name) < 1:
                raise ConfigError.for_variable(_limit_variable(f.name), "must be >= 1")

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Self:
        defaults = cls()
        values = {
            f.name: env_int(
                environ, _limit_variable(f.name), getattr(defaults, f.name), min_value=1
            )
            for f in fields(cls)
        }
        return cls(**values)


def _limit_variable(name: str) -> str:
    return f"ROUTER_{name.upper()}"


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


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the router needs to run."""

    server: ServerSettings
    downstream: DownstreamSettings
    models_config: Path = Path(DEFAULT_MODELS_CONFIG)
    model_root: Path = Path(DEFAULT_MODEL_ROOT)
    policies_config: Path = Path(DEFAULT_POLICIES_CONFIG)
    outbox_dir: Path = Path(DEFAULT_OUTBOX_DIR)
    routing: RoutingSettings = field(default_factory=RoutingSettings)
    limits: Limits = field(default_factory=Limits)
    # The OpenAI-compatible HTTP listener; None = off. Loopback by default: like the gRPC
    # port, it trusts the identity headers that the edge sets.
    http_host: str = "127.0.0.1"
    http_port: int | None = None
    token_memo: MemoSettings = field(default_factory=MemoSettings)
    tokenize: TokenizeMode = TokenizeMode.SPECULATE
    attestation: AttestationSettings = field(default_factory=AttestationSettings)
    leases: LeaseSettings = field(default_factory=LeaseSettings)
    near_cache: NearCacheSettings = field(default_factory=NearCacheSettings)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Self:
        """Read GRPC_PORT, METRICS_PORT, ... (see ServerSettings), MODELS_CONFIG, MODEL_ROOT,
        ROUTER_POLICIES, ROUTER_OUTBOX_DIR, ROUTER_HTTP_HOST, ROUTER_HTTP_PORT (default off),
        ROUTER_TOKEN_MEMO_TOKENS / _TTL_S (the tokenization memo; 0 tokens = off),
        ROUTER_TOKENIZE (speculate | service | auto | local: see local_tokenizer),
        ROUTER_TOKENIZER_ATTEST_INTERVAL_S / _AUDIT_RATE (see attestation),
        ROUTER_QUOTA_LEASE_S / _MAX_SHARE (see quota_lease),
        ROUTER_NEAR_CACHE_ENTRIES / _MAX_BYTES / _TTL_S / _REPORT_S (see near_cache; 0 = off),
        the *_SERVICE_ADDR variables and ROUTER_*;
        ConfigError names the offending variable."""
        server = ServerSettings.from_env(
            environ,
            service_name=SERVICE_NAME,
            default_grpc_port=DEFAULT_GRPC_PORT,
            default_metrics_port=DEFAULT_METRICS_PORT,
        )
        return cls(
            server=server,
            downstream=DownstreamSettings.from_env(environ),
            models_config=Path(env_str(environ, "MODELS_CONFIG", DEFAULT_MODELS_CONFIG)),
            model_root=Path(env_str(environ, "MODEL_ROOT", DEFAULT_MODEL_ROOT)),
            policies_config=Path(env_str(environ, "ROUTER_POLICIES", DEFAULT_POLICIES_CONFIG)),
            outbox_dir=Path(env_str(environ, "ROUTER_OUTBOX_DIR", DEFAULT_OUTBOX_DIR)),
            routing=RoutingSettings.from_env(environ),
            limits=Limits.from_env(environ),
            http_host=env_str(environ, "ROUTER_HTTP_HOST", "127.0.0.1"),
            http_port=env_optional_port(environ, "ROUTER_HTTP_PORT", None),
            token_memo=_memo_from_env(environ),
            tokenize=_tokenize_mode(environ),
            attestation=_attestation_from_env(environ),
            leases=_leases_from_env(environ),
            near_cache=_near_cache_from_env(environ),
        )


def _tokenize_mode(environ: Mapping[str, str]) -> TokenizeMode:
    value = env_str(environ, "ROUTER_TOKENIZE", TokenizeMode.SPECULATE.value).lower()
    try:
        return TokenizeMode(value)
    except ValueError:
        choices = ", ".join(mode.value for mode in TokenizeMode)
        raise ConfigError.for_variable("ROUTER_TOKENIZE", f"must be one of {choices}") from None


def _attestation_from_env(environ: Mapping[str, str]) -> AttestationSettings:
    d = AttestationSettings()
    return AttestationSettings(
        interval_s=env_float(
            environ, "ROUTER_TOKENIZER_ATTEST_INTERVAL_S", d.interval_s, min_value=0.0
        ),
        audit_rate=env_float(
            environ, "ROUTER_TOKENIZER_AUDIT_RATE", d.audit_rate, min_value=0.0, max_value=1.0
        ),
    )


def _leases_from_env(environ: Mapping[str, str]) -> LeaseSettings:
    d = LeaseSettings()
    return LeaseSettings(
        lease_s=env_float(environ, "ROUTER_QUOTA_LEASE_S", d.lease_s, min_value=0.0),
        max_share=env_float(
            environ, "ROUTER_QUOTA_LEASE_MAX_SHARE", d.max_share, min_value=0.0, max_value=0.5
        ),
    )


def _memo_from_env(environ: Mapping[str, str]) -> MemoSettings:
    d = MemoSettings()
    return MemoSettings(
        max_tokens=env_int(environ, "ROUTER_TOKEN_MEMO_TOKENS", d.max_tokens, min_value=0),
        ttl_s=env_float(environ, "ROUTER_TOKEN_MEMO_TTL_S", d.ttl_s, min_value=0.001),
    )


def _near_cache_from_env(environ: Mapping[str, str]) -> NearCacheSettings:
    d = NearCacheSettings()
    return NearCacheSettings(
        max_entries=env_int(environ, "ROUTER_NEAR_CACHE_ENTRIES", d.max_entries, min_value=0),
        max_bytes=env_int(environ, "ROUTER_NEAR_CACHE_MAX_BYTES", d.max_bytes, min_value=0),
        ttl_s=env_float(
            environ, "ROUTER_NEAR_CACHE_TTL_S", d.ttl_s, min_value=0.001, max_value=3600.0
        ),
        report_interval_s=env_float(
            environ,
            "ROUTER_NEAR_CACHE_REPORT_S",
            d.report_interval_s,
            min_value=0.01,
            max_value=60.0,
        ),
    )
