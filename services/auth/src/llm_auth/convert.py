"""Domain values <-> AuthService messages."""

from __future__ import annotations

from google.protobuf import duration_pb2, timestamp_pb2

from llm_auth.principal import KeyLimits, Principal
from llm_auth.records import KeyRecord
from llmapi.auth.v1 import auth_service_pb2 as pb


def timestamp_ms(ms: int) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromMilliseconds(ms)
    return ts


def duration_s(seconds: float) -> duration_pb2.Duration:
    duration = duration_pb2.Duration()
    duration.FromNanoseconds(round(seconds * 1e9))
    return duration


def limits_pb(limits: KeyLimits) -> pb.KeyLimits:
    return pb.KeyLimits(
        requests_per_minute=limits.requests_per_minute,
        tokens_per_minute=limits.tokens_per_minute,
        max_concurrent_requests=limits.max_concurrent,
    )


def limits_from_pb(limits: pb.KeyLimits) -> KeyLimits:
    return KeyLimits(
        requests_per_minute=limits.requests_per_minute,
        tokens_per_minute=limits.tokens_per_minute,
        max_concurrent=limits.max_concurrent_requests,
    )


def principal_pb(principal: Principal) -> pb.Principal:
    return pb.Principal(
        tenant_id=principal.tenant_id,
        key_id=principal.key_id,
        scopes=principal.scopes,
        allowed_models=principal.allowed_models,
        limits=limits_pb(principal.limits),
        credential_type=principal.credential_type.value,
    )


def api_key_pb(record: KeyRecord) -> pb.ApiKey:
    key = pb.ApiKey(
        key_id=record.key_id,
        tenant_id=record.tenant_id,
        name=record.name,
        scopes=record.scopes,
        allowed_models=record.allowed_models,
        limits=limits_pb(record.limits),
        labels=dict(record.labels),
        created_at=timestamp_ms(record.created_at_ms),
        secret_hint=record.secret_hint,
    )
    if record.expires_at_ms:
        key.expires_at.CopyFrom(timestamp_ms(record.expires_at_ms))
    if record.revoked_at_ms:
        key.revoked_at.CopyFrom(timestamp_ms(record.revoked_at_ms))
    return key
