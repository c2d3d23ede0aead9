"""The ledger's values: what Reserve, Settle and Release take and give back."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ReserveInput:
    """A request to admit."""

    request_id: str
    tenant_id: str
    key_id: str
    model: str
    prompt_tokens: int
    max_completion_tokens: int


@dataclass(frozen=True, slots=True)
class Reservation:
    """What Reserve held (or had held, when `duplicate`)."""

    request_id: str
    reserved_micros: int
    currency: str
    soft_limit_exceeded: bool
    expires_at_ms: int
    duplicate: bool
    budgeted: bool = True  # a budget (tenant's or key's) applied; unknown on a duplicate


@dataclass(frozen=True, slots=True)
class Usage:
    """Actual usage of a finished request."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    finish_reason: int


@dataclass(frozen=True, slots=True)
class Admission:
    """Who and what to bill when a Settle finds no reservation (admitted while billing was
    unreachable); `admitted_at_ms` None means now."""

    key_id: str
    model: str
    admitted_at_ms: int | None


@dataclass(frozen=True, slots=True)
class SettleInput:
    """A Settle: `tenant_id` may be empty (looked up); `admission` is needed only when there
    is no reservation."""

    request_id: str
    tenant_id: str
    usage: Usage
    admission: Admission | None = None


@dataclass(frozen=True, slots=True)
class Settlement:
    """The outcome of a Settle."""

    request_id: str
    charged_micros: int
    currency: str
    duplicate: bool
    corrected: bool
    unreserved: bool


@dataclass(frozen=True, slots=True)
class ReleaseInput:
    """A Release: `tenant_id` may be empty (looked up)."""

    request_id: str
    tenant_id: str = ""


BatchOp = SettleInput | ReleaseInput
# Per op: a Settlement (settle), whether something was released (release), or the error
# the unary call would have raised (an Exception that is not a ServiceError is a bug).
BatchOutcome = Settlement | bool | Exception
