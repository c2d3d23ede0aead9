"""Audit events: who did what to which resource, when, from where, and how it ended.

Key creation, revocation and rotation, budget changes and other admin calls are written here,
apart from access and application logs: one JSON object a line on the `llm.audit` logger, which
does not propagate to the root logger (so log level and sampling of the service's logs never
drop an audit line). `AUDIT_LOG_FILE` sends the lines to a file (appended; a shipper or a
WORM bucket takes them from there); unset, to stderr, each line marked `"log_type": "audit"`.

Events carry ids, never secrets or request text: a detail whose key looks sensitive
(llm_common.logging's rule) is dropped, and values are scrubbed of anything credential-like.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from llm_common.errors import ServiceError
from llm_common.logging import is_sensitive_key, scrub_text

AUDIT_LOGGER = "llm.audit"
AUDIT_LOG_FILE_ENV = "AUDIT_LOG_FILE"
# Metadata the edge sets on every call it authenticated (llm_auth's identity headers), and the
# client address hops it appended.
_KEY_ID, _TENANT, _FORWARDED = "x-key-id", "x-tenant-id", "x-forwarded-for"


@dataclass(frozen=True, slots=True)
class AuditEvent:
    """One audited action. `outcome` is "OK" or the gRPC status name it failed with."""

    action: str  # e.g. "key.create", "key.revoke", "budget.set"
    actor: str  # key id of the credential that called ("-" when none verified)
    actor_tenant: str
    target: str  # e.g. "key:0123456789abcdef", "tenant:acme"
    outcome: str
    source: str  # the caller's address as the service saw it
    details: Mapping[str, str] = field(default_factory=dict)

    def as_json(self, at: datetime) -> str:
        details = {
            k: scrub_text(str(v)) for k, v in self.details.items() if not is_sensitive_key(k)
        }
        return json.dumps(
            {
                "log_type": "audit",
                "at": at.isoformat(timespec="milliseconds"),
                "action": self.action,
                "actor": self.actor,
                "actor_tenant": self.actor_tenant,
                "target": self.target,
                "outcome": self.outcome,
                "source": self.source,
                "details": details,
            },
            sort_keys=True,
        )


class AuditLog:
    """Writes AuditEvents to the `llm.audit` logger (see configure_audit)."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self._logger = logger or logging.getLogger(AUDIT_LOGGER)

    def record(self, event: AuditEvent) -> None:
        self._logger.info(event.as_json(datetime.now(UTC)))


def configure_audit(environ: Mapping[str, str]) -> logging.Logger:
    """Give `llm.audit` its own handler (AUDIT_LOG_FILE, else stderr), plain lines, no
    propagation to the service's log. Idempotent: an existing handler is replaced."""
    logger = logging.getLogger(AUDIT_LOGGER)
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    path = environ.get(AUDIT_LOG_FILE_ENV, "").strip()
    new: logging.Handler = (
        logging.FileHandler(path, encoding="utf-8") if path else logging.StreamHandler(sys.stderr)
    )
    new.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(new)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger


@dataclass(frozen=True, slots=True)
class Caller:
    """Who made a call and from where, as the mesh tells the service."""

    key_id: str
    tenant: str
    source: str  # the connection's peer
    forwarded_for: str  # x-forwarded-for as the edge passed it ("" if none); clients can
    # prepend to it, only the hops the edge and the mesh appended are trustworthy

    def source_details(self) -> dict[str, str]:
        return {"forwarded_for": self.forwarded_for} if self.forwarded_for else {}


def caller_of(metadata: Iterable[tuple[str, Any]] | None, peer: str) -> Caller:
    """The edge-set identity (x-key-id, x-tenant-id) and where the call came from."""
    values = {k.lower(): str(v) for k, v in (metadata or ())}
    return Caller(
        values.get(_KEY_ID, "-"), values.get(_TENANT, "-"), peer, values.get(_FORWARDED, "")
    )


@contextlib.contextmanager
def audited(
    log: AuditLog,
    context: Any,
    action: str,
    target: str,
    details: Mapping[str, str] | None = None,
) -> Iterator[None]:
    """Audit the block as `action` on `target` by the call's caller (a grpc.aio context): OK,
    the ServiceError's status name, or INTERNAL for anything else; re-raises."""
    outcome = "INTERNAL"
    try:
        yield
        outcome = "OK"
    except ServiceError as err:
        outcome = err.code.name
        raise
    finally:
        who = caller_of(context.invocation_metadata(), context.peer())
        log.record(
            AuditEvent(
                action=action,
                actor=who.key_id,
                actor_tenant=who.tenant,
                target=target,
                outcome=outcome,
                source=who.source,
                details={**(details or {}), **who.source_details()},
            )
        )
