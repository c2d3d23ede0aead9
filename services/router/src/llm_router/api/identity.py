"""The caller's identity and permissions, as the edge put them in the request metadata."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from llm_common.errors import PermissionDenied, Unauthenticated
from llm_common.models_config import ModelSpec

TENANT_HEADER = "x-tenant-id"
KEY_HEADER = "x-key-id"
SCOPES_HEADER = "x-scopes"
ALLOWED_MODELS_HEADER = "x-allowed-models"  # the key's model restriction, when it has one

SCOPE_COMPLETION = "completion:write"
SCOPE_EMBEDDING = "embedding:read"
SCOPE_ADMIN = "admin"
MODEL_SCOPE_PREFIX = "model:"
TIER_SCOPE_PREFIX = "tier:"

# What both auth and billing accept as a tenant id.
_TENANT_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# API key ids, and `jwt:<subject>` for JWT callers (printable ASCII).
_KEY_PATTERN = re.compile(r"[\x21-\x7e]{1,260}")
# Key ids billing accepts; others (JWT subjects) are billed to the tenant without a key.
_BILLING_KEY_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
_REGION_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,64}")
_MAX_SCOPES = 64
_MAX_REGIONS = 8


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is calling (tenant, key) and what the credential allows (scopes).

    The key's model restriction (`x-allowed-models`) and `model:<name>` scopes limit it to
    those models; `tier:<name>` scopes to those price tiers; without either the key may use
    every model its tenant policy allows.
    """

    tenant_id: str
    key_id: str
    scopes: frozenset[str]
    regions: tuple[str, ...] = ()  # preferred regions from the request header, best first
    allowed_models: frozenset[str] = frozenset()

    @property
    def model_scopes(self) -> frozenset[str]:
        return _suffixes(self.scopes, MODEL_SCOPE_PREFIX) | self.allowed_models

    @property
    def billing_key_id(self) -> str:
        """The key id billing records usage under ('' for JWT callers)."""
        return self.key_id if _BILLING_KEY_PATTERN.fullmatch(self.key_id) else ""

    @property
    def tier_scopes(self) -> frozenset[str]:
        return _suffixes(self.scopes, TIER_SCOPE_PREFIX)

    def has_scope(self, *any_of: str) -> bool:
        """Whether the credential holds one of `any_of` (admin holds every scope)."""
        return SCOPE_ADMIN in self.scopes or any(s in self.scopes for s in any_of)

    def require_scope(self, *any_of: str) -> None:
        """PERMISSION_DENIED (reason SCOPE_MISSING) unless one of `any_of` is held."""
        if not self.has_scope(*any_of):
            raise PermissionDenied(
                f"the credential lacks the scope {' or '.join(any_of)}",
                reason="SCOPE_MISSING",
                metadata={"required": ",".join(any_of)},
            )

    def may_use(self, spec: ModelSpec, allowed_tiers: frozenset[str]) -> bool:
        """Whether this caller may use `spec` (model scopes, tier scopes, tenant tiers)."""
        models = self.model_scopes
        if models and not ({spec.name, *spec.aliases} & models):
            return False
        tiers = self.tier_scopes
        if tiers and spec.tier not in tiers:
            return False
        return not allowed_tiers or spec.tier in allowed_tiers

    def require_model(self, spec: ModelSpec, allowed_tiers: frozenset[str]) -> None:
        """PERMISSION_DENIED (reason MODEL_NOT_ALLOWED) unless `may_use`."""
        if not self.may_use(spec, allowed_tiers):
            raise PermissionDenied(
                f"the credential may not use model {spec.name!r}",
                reason="MODEL_NOT_ALLOWED",
                metadata={"model": spec.name, "tier": spec.tier},
            )


def _suffixes(scopes: Iterable[str], prefix: str) -> frozenset[str]:
    return frozenset(
        s[len(prefix) :] for s in scopes if s.startswith(prefix) and len(s) > len(prefix)
    )


def caller_from_metadata(metadata: Iterable[tuple[str, Any]] | None, region_header: str) -> Caller:
    """The Caller from x-tenant-id / x-key-id / x-scopes (set by the edge after ext_authz).

    UNAUTHENTICATED when the tenant is missing or malformed: the edge always sets it, so its
    absence means the request bypassed authentication.
    """
    values = _first_values(metadata)
    tenant = values.get(TENANT_HEADER, "")
    if not _TENANT_PATTERN.fullmatch(tenant):
        raise Unauthenticated("no authenticated tenant on the request", reason="IDENTITY_MISSING")
    key = values.get(KEY_HEADER, "")
    if key and not _KEY_PATTERN.fullmatch(key):
        raise Unauthenticated("malformed key id on the request", reason="IDENTITY_INVALID")
    scopes = _split(values.get(SCOPES_HEADER, ""), _MAX_SCOPES)
    regions = tuple(
        r for r in _split_ordered(values.get(region_header, "")) if _REGION_PATTERN.fullmatch(r)
    )
    models = _split_ordered(values.get(ALLOWED_MODELS_HEADER, ""))[:_MAX_SCOPES]
    return Caller(
        tenant_id=tenant,
        key_id=key,
        scopes=frozenset(scopes),
        regions=regions[:_MAX_REGIONS],
        allowed_models=frozenset(models),
    )


def _first_values(metadata: Iterable[tuple[str, Any]] | None) -> dict[str, str]:
    values: dict[str, str] = {}
    for key, value in metadata or ():
        if isinstance(value, str) and key not in values:
            values[key] = value.strip()
    return values


def _split(raw: str, limit: int) -> list[str]:
    # The edge may join scopes with spaces (OAuth style) or commas.
    return [s for s in re.split(r"[\s,]+", raw) if s][:limit]


def _split_ordered(raw: str) -> list[str]:
    return [s.strip() for s in raw.split(",") if s.strip()]
