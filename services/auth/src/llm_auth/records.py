"""A stored API key: metadata and digests as kept in one Redis hash, never the secret."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Self

from llm_auth.apikeys import ParsedKey, matches
from llm_auth.principal import CredentialType, KeyLimits, Principal


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """Everything known about one API key. Times are Unix milliseconds; 0 means unset."""

    key_id: str
    tenant_id: str
    digest: str
    name: str = ""
    scopes: tuple[str, ...] = ()
    allowed_models: tuple[str, ...] = ()
    limits: KeyLimits = field(default_factory=KeyLimits)
    labels: Mapping[str, str] = field(default_factory=dict)
    secret_hint: str = ""
    created_at_ms: int = 0
    expires_at_ms: int = 0
    revoked_at_ms: int = 0
    # The secret replaced by the last rotation, valid until previous_expires_at_ms.
    previous_digest: str = ""
    previous_expires_at_ms: int = 0

    def is_revoked(self) -> bool:
        return self.revoked_at_ms > 0

    def is_expired(self, now_ms: int) -> bool:
        return 0 < self.expires_at_ms <= now_ms

    def secret_matches(self, pepper: bytes, key: ParsedKey, now_ms: int) -> bool:
        """Whether `key` is this key's current secret, or its previous one within the grace."""
        if matches(pepper, key, self.digest):
            return True
        in_grace = now_ms < self.previous_expires_at_ms
        return in_grace and matches(pepper, key, self.previous_digest)

    def principal(self) -> Principal:
        """The identity this key grants."""
        return Principal(
            tenant_id=self.tenant_id,
            key_id=self.key_id,
            credential_type=CredentialType.API_KEY,
            scopes=self.scopes,
            allowed_models=self.allowed_models,
            limits=self.limits,
        )

    def to_redis(self) -> dict[str, str]:
        """The fields of the Redis hash."""
        return {
            "tenant_id": self.tenant_id,
            "digest": self.digest,
            "name": self.name,
            "scopes": json.dumps(list(self.scopes)),
            "allowed_models": json.dumps(list(self.allowed_models)),
            "rpm": str(self.limits.requests_per_minute),
            "tpm": str(self.limits.tokens_per_minute),
            "concurrency": str(self.limits.max_concurrent),
            "labels": json.dumps(dict(self.labels), sort_keys=True),
            "secret_hint": self.secret_hint,
            "created_at_ms": str(self.created_at_ms),
            "expires_at_ms": str(self.expires_at_ms),
            "revoked_at_ms": str(self.revoked_at_ms),
            "previous_digest": self.previous_digest,
            "previous_expires_at_ms": str(self.previous_expires_at_ms),
        }

    @classmethod
    def from_redis(cls, key_id: str, raw: Mapping[bytes | str, bytes | str]) -> Self:
        """Decode a hash read with HGETALL."""
        f = {as_text(k): as_text(v) for k, v in raw.items()}
        return cls(
            key_id=key_id,
            tenant_id=f["tenant_id"],
            digest=f["digest"],
            name=f.get("name", ""),
            scopes=tuple(json.loads(f.get("scopes", "[]"))),
            allowed_models=tuple(json.loads(f.get("allowed_models", "[]"))),
            limits=KeyLimits(
                requests_per_minute=int(f.get("rpm", "0")),
                tokens_per_minute=int(f.get("tpm", "0")),
                max_concurrent=int(f.get("concurrency", "0")),
            ),
            labels=json.loads(f.get("labels", "{}")),
            secret_hint=f.get("secret_hint", ""),
            created_at_ms=int(f.get("created_at_ms", "0")),
            expires_at_ms=int(f.get("expires_at_ms", "0")),
            revoked_at_ms=int(f.get("revoked_at_ms", "0")),
            previous_digest=f.get("previous_digest", ""),
            previous_expires_at_ms=int(f.get("previous_expires_at_ms", "0")),
        )


def as_text(value: bytes | str) -> str:
    """A Redis reply item as text (clients may or may not decode responses)."""
    return value.decode() if isinstance(value, bytes) else value
