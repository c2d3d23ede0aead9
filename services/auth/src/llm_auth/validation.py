"""Input validation of AuthService requests: every field checked, every violation reported."""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable, Mapping
from typing import Any

from llm_auth.apikeys import KEY_ID_PATTERN
from llm_auth.authenticator import MAX_CREDENTIAL_CHARS
from llm_common.validation import Violations, check_range, check_repeated, check_text

TENANT_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,64}")
SCOPE_PATTERN = re.compile(r"[A-Za-z0-9._:*-]{1,128}")
MODEL_PATTERN = re.compile(r"[A-Za-z0-9._:/@*-]{1,256}")
LABEL_KEY_PATTERN = re.compile(r"[a-z0-9]([a-z0-9._/-]{0,61}[a-z0-9])?")
PRINCIPAL_KEY_PATTERN = re.compile(r"[\x21-\x7e]{1,260}")  # API key id or jwt:<subject>
REQUEST_ID_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,128}")
MAX_NAME_CHARS = 128
MAX_SCOPES = 64
MAX_MODELS = 64
MAX_LABELS = 32
MAX_LABEL_VALUE_BYTES = 256
MAX_LIMIT = 10**12
MAX_PAGE_SIZE = 1000
DEFAULT_PAGE_SIZE = 100
MAX_KEY_TTL_S = 10 * 365 * 86400
MAX_GRACE_S = 30 * 86400
DEFAULT_GRACE_S = 86400
MIN_LEASE_TTL_S = 0.1


def check_pattern(
    v: Violations, field: str, value: str, pattern: re.Pattern[str], what: str
) -> bool:
    """`value` must fully match `pattern`; `what` describes the allowed form."""
    if not value:
        v.add(field, "must not be empty")
        return False
    return v.require(pattern.fullmatch(value) is not None, field, f"must be {what}")


def check_tenant(v: Violations, field: str, value: str) -> None:
    check_pattern(v, field, value, TENANT_PATTERN, "1-64 characters of A-Z a-z 0-9 . _ -")


def check_key_id(v: Violations, field: str, value: str) -> None:
    check_pattern(v, field, value, KEY_ID_PATTERN, "a key id (16 lowercase hex digits)")


def check_principal_key(v: Violations, field: str, value: str) -> None:
    check_pattern(v, field, value, PRINCIPAL_KEY_PATTERN, "a key id or jwt:<subject>")


def check_request_id(v: Violations, field: str, value: str) -> None:
    check_pattern(v, field, value, REQUEST_ID_PATTERN, "1-128 characters of A-Z a-z 0-9 . _ : -")


def check_items(
    v: Violations, field: str, items: Iterable[str], pattern: re.Pattern[str], max_items: int
) -> None:
    values = list(items)
    if not check_repeated(v, field, values, max_items=max_items):
        return
    for i, value in enumerate(values):
        if not pattern.fullmatch(value):
            v.add(f"{field}[{i}]", f"must match {pattern.pattern}")


def check_scopes(v: Violations, field: str, scopes: Iterable[str]) -> None:
    check_items(v, field, scopes, SCOPE_PATTERN, MAX_SCOPES)


def check_limits(v: Violations, field: str, limits: Any) -> None:
    for name in ("requests_per_minute", "tokens_per_minute", "max_concurrent_requests"):
        check_range(v, f"{field}.{name}", getattr(limits, name), min_value=0, max_value=MAX_LIMIT)


def check_labels(v: Violations, field: str, labels: Mapping[str, str]) -> None:
    if len(labels) > MAX_LABELS:
        v.add(field, f"must have at most {MAX_LABELS} entries")
        return
    for key, value in labels.items():
        if not LABEL_KEY_PATTERN.fullmatch(key):
            v.add(f"{field}[{key[:64]!r}]", "key must be 1-63 of a-z 0-9 . _ / -")
        check_text(v, f"{field}[{key[:64]!r}]", value, MAX_LABEL_VALUE_BYTES, allow_empty=True)


def check_seconds(
    v: Violations, field: str, seconds: float, *, max_s: float, min_s: float = 0
) -> None:
    check_range(v, field, seconds, min_value=min_s, max_value=max_s)


def start_authenticate(request: Any) -> Violations:
    v = Violations()
    check_text(v, "credential", request.credential, MAX_CREDENTIAL_CHARS)
    check_scopes(v, "required_scopes", request.required_scopes)
    if request.model:
        check_pattern(v, "model", request.model, MODEL_PATTERN, "a model name")
    return v


def check_create(request: Any) -> None:
    v = Violations()
    check_tenant(v, "tenant_id", request.tenant_id)
    check_text(v, "name", request.name, MAX_NAME_CHARS, allow_empty=True)
    check_scopes(v, "scopes", request.scopes)
    check_items(v, "allowed_models", request.allowed_models, MODEL_PATTERN, MAX_MODELS)
    check_limits(v, "limits", request.limits)
    check_labels(v, "labels", request.labels)
    ttl_s = request.ttl.ToNanoseconds() / 1e9
    check_seconds(v, "ttl", ttl_s, max_s=MAX_KEY_TTL_S)
    v.raise_if_any()


def check_list(request: Any) -> int:
    """Validates a ListKeys request; returns the offset its page token points at."""
    v = Violations()
    check_tenant(v, "tenant_id", request.tenant_id)
    check_range(v, "page_size", request.page_size, min_value=0, max_value=MAX_PAGE_SIZE)
    offset = decode_page_token(request.page_token)
    v.require(offset is not None, "page_token", "is not a token this service issued")
    v.raise_if_any()
    return offset or 0


def encode_page_token(offset: int) -> str:
    return base64.urlsafe_b64encode(f"o:{offset}".encode()).decode().rstrip("=")


def decode_page_token(token: str) -> int | None:
    """The offset, 0 for an empty token, None for a token this service did not issue."""
    if not token:
        return 0
    if len(token) > 32:
        return None
    try:
        text = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    prefix, _, number = text.partition(":")
    if prefix != "o" or not number.isdigit():
        return None
    return int(number)


def check_key_ref(request: Any) -> None:
    v = Violations()
    check_key_id(v, "key_id", request.key_id)
    v.raise_if_any()


def check_tenant_ref(request: Any) -> None:
    v = Violations()
    check_tenant(v, "tenant_id", request.tenant_id)
    v.raise_if_any()


def check_rotate(request: Any) -> float:
    """Validates a RotateKey request; returns the grace period in seconds."""
    v = Violations()
    check_key_id(v, "key_id", request.key_id)
    has_grace = request.HasField("grace_period")
    grace_s = request.grace_period.ToNanoseconds() / 1e9 if has_grace else DEFAULT_GRACE_S
    check_seconds(v, "grace_period", grace_s, max_s=MAX_GRACE_S)
    v.raise_if_any()
    return grace_s


def check_reserve(request: Any) -> None:
    v = Violations()
    check_tenant(v, "tenant_id", request.tenant_id)
    check_principal_key(v, "key_id", request.key_id)
    check_range(v, "tokens", request.tokens, min_value=1, max_value=MAX_LIMIT)
    check_request_id(v, "reservation_id", request.reservation_id)
    v.raise_if_any()


def check_refund(request: Any) -> None:
    v = Violations()
    check_tenant(v, "tenant_id", request.tenant_id)
    check_principal_key(v, "key_id", request.key_id)
    check_range(v, "tokens", request.tokens, min_value=0, max_value=MAX_LIMIT)
    check_request_id(v, "reservation_id", request.reservation_id)
    v.raise_if_any()


def check_acquire(request: Any, default_ttl_s: float, max_ttl_s: float) -> float:
    """Validates an AcquireConcurrency request; returns the lease TTL in seconds."""
    v = Violations()
    check_tenant(v, "tenant_id", request.tenant_id)
    check_principal_key(v, "key_id", request.key_id)
    check_request_id(v, "lease_id", request.lease_id)
    ttl_s = request.ttl.ToNanoseconds() / 1e9 if request.HasField("ttl") else 0.0
    if ttl_s != 0:
        check_seconds(v, "ttl", ttl_s, min_s=MIN_LEASE_TTL_S, max_s=max_ttl_s)
    v.raise_if_any()
    return ttl_s if ttl_s > 0 else default_ttl_s


def check_release(request: Any) -> None:
    v = Violations()
    check_tenant(v, "tenant_id", request.tenant_id)
    check_principal_key(v, "key_id", request.key_id)
    check_request_id(v, "lease_id", request.lease_id)
    v.raise_if_any()
