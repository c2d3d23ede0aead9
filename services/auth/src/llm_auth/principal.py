"""Who a verified credential belongs to, and what it may do (scopes, models)."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field

from llm_common.errors import PermissionDenied

ADMIN_SCOPE = "admin"
MODEL_SCOPE_PREFIX = "model:"
ANY_MODEL = "*"


class CredentialType(enum.StrEnum):
    """How the principal proved its identity."""

    API_KEY = "api_key"
    JWT = "jwt"


@dataclass(frozen=True, slots=True)
class KeyLimits:
    """Per-key limits; 0 means unlimited."""

    requests_per_minute: int = 0
    tokens_per_minute: int = 0
    max_concurrent: int = 0


@dataclass(frozen=True, slots=True)
class Principal:
    """A verified identity: tenant, key (or JWT subject), scopes, models and limits."""

    tenant_id: str
    key_id: str
    credential_type: CredentialType
    scopes: tuple[str, ...] = ()
    allowed_models: tuple[str, ...] = ()
    limits: KeyLimits = field(default_factory=KeyLimits)

    @property
    def model_restriction(self) -> tuple[str, ...]:
        """Models this principal is limited to (allowed models and `model:<name>` scopes);
        empty means every model."""
        scoped = (s[len(MODEL_SCOPE_PREFIX) :] for s in self.scopes if _is_model_scope(s))
        return tuple(dict.fromkeys((*self.allowed_models, *scoped)))

    def missing_scopes(self, required: Iterable[str]) -> list[str]:
        """The required scopes this principal lacks, in order."""
        held = set(self.scopes)
        return [scope for scope in required if scope not in held]

    def may_use_model(self, model: str) -> bool:
        """Whether requests for `model` are allowed."""
        restriction = self.model_restriction
        return not restriction or ANY_MODEL in restriction or model in restriction

    @property
    def is_admin(self) -> bool:
        return ADMIN_SCOPE in self.scopes


def _is_model_scope(scope: str) -> bool:
    return scope.startswith(MODEL_SCOPE_PREFIX) and len(scope) > len(MODEL_SCOPE_PREFIX)


def authorize(principal: Principal, required_scopes: Iterable[str], model: str = "") -> None:
    """PermissionDenied (SCOPE_MISSING or MODEL_NOT_ALLOWED) unless the principal may proceed."""
    missing = principal.missing_scopes(required_scopes)
    if missing:
        raise PermissionDenied(
            f"credential lacks required scope(s): {', '.join(missing)}",
            reason="SCOPE_MISSING",
            metadata={"missing_scopes": ",".join(missing)},
        )
    if model and not principal.may_use_model(model):
        raise PermissionDenied(
            f"credential may not use model {model!r}",
            reason="MODEL_NOT_ALLOWED",
            metadata={"model": model},
        )
