"""API key format (`sk-<key id>.<secret>`), generation and HMAC-SHA256 digests under a pepper."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

KEY_PREFIX = "sk-"
KEY_ID_BYTES = 8  # 16 hex characters: unique enough to index, never secret
SECRET_BYTES = 32  # 256 bits of entropy, base64url without padding: 43 characters
MAX_KEY_CHARS = 128
_KEY_PATTERN = re.compile(r"sk-(?P<key_id>[0-9a-f]{16})\.(?P<secret>[A-Za-z0-9_-]{43})")
KEY_ID_PATTERN = re.compile(r"[0-9a-f]{16}")


class MalformedKeyError(ValueError):
    """The text is not shaped like one of our API keys."""


@dataclass(frozen=True, slots=True)
class ParsedKey:
    """The two halves of an API key; only the key id may be logged or stored."""

    key_id: str
    secret: str

    def __repr__(self) -> str:  # keeps the secret out of tracebacks and debug output
        return f"ParsedKey(key_id={self.key_id!r}, secret=<hidden>)"

    @property
    def text(self) -> str:
        """The full key as the client sends it."""
        return f"{KEY_PREFIX}{self.key_id}.{self.secret}"

    @property
    def hint(self) -> str:
        """A display form that identifies the key without revealing it."""
        return f"{KEY_PREFIX}{self.key_id}.{self.secret[:4]}…"


def new_key_id() -> str:
    """A fresh random key id."""
    return secrets.token_hex(KEY_ID_BYTES)


def new_secret() -> str:
    """A fresh random secret."""
    return secrets.token_urlsafe(SECRET_BYTES)


def generate_key(key_id: str | None = None) -> ParsedKey:
    """A new key; pass `key_id` to issue a new secret for an existing key (rotation)."""
    return ParsedKey(key_id=key_id or new_key_id(), secret=new_secret())


def looks_like_key(text: str) -> bool:
    """Whether `text` claims to be an API key (rather than a JWT)."""
    return text.startswith(KEY_PREFIX)


def parse_key(text: str) -> ParsedKey:
    """Split `sk-<key id>.<secret>`; MalformedKeyError if the shape is wrong."""
    if len(text) > MAX_KEY_CHARS:
        raise MalformedKeyError("API key is too long")
    match = _KEY_PATTERN.fullmatch(text)
    if match is None:
        raise MalformedKeyError("API key is malformed")
    return ParsedKey(key_id=match["key_id"], secret=match["secret"])


def digest(pepper: bytes, key: ParsedKey) -> str:
    """HMAC-SHA256 of the whole key under the server pepper, hex.

    The key id is part of the message, so a digest cannot be moved to another key record.
    Without the pepper a leaked Redis dump cannot be used to test guesses offline.
    """
    return hmac.new(pepper, key.text.encode("ascii"), hashlib.sha256).hexdigest()


def matches(pepper: bytes, key: ParsedKey, stored_digest: str) -> bool:
    """Constant-time comparison of the key's digest with a stored one."""
    if not stored_digest:
        return False
    return hmac.compare_digest(digest(pepper, key), stored_digest)
