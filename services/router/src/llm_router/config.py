"""Router settings, read from the environment once in __main__ (tests pass dicts)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Self

from llm_common.config import (
    MIB,
    ConfigError,
    ServerSettings,
    env_float,
    env_int,
    env_optional_port,
    env_str,
)
from llm_router.admission.quota_lease import LeaseSettings
from llm_router.cache.near import NearCacheSettings
from llm_router.clients.settings import DownstreamSettings
from llm_router.routing.settings import RoutingSettings
from llm_router.tokens.attestation import AttestationSettings
from llm_router.tokens.local import TokenizeMode
from llm_router.tokens.memo import MemoSettings

SERVICE_NAME = "router"
DEFAULT_GRPC_PORT = 50053
DEFAULT_METRICS_PORT = 9153
DEFAULT_MODELS_CONFIG = "infra/config/models.yaml"
DEFAULT_POLICIES_CONFIG = "infra/config/policies.yaml"
DEFAULT_MODEL_ROOT = ".cache/models"
DEFAULT_OUTBOX_DIR = ".cache/router-outbox"


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
