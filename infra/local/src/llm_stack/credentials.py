"""The stack's own secrets (auth pepper, bootstrap admin key, the cache's master key), kept in
the run directory.

They persist across restarts because Redis does: keys stored under one pepper are unusable
under another. Files are created 0600; the services read them through `*_FILE` variables.
"""

from __future__ import annotations

import base64
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

PEPPER_FILE = "auth-pepper"
ADMIN_KEY_FILE = "admin-api-key"
CACHE_MASTER_KEY_FILE = "cache-master.keys"  # `<id>:<base64 32 bytes>` lines, active first


@dataclass(frozen=True, slots=True)
class Credentials:
    """Paths of the secret files and the admin key itself (for creating the demo key)."""

    pepper_file: Path
    admin_key_file: Path
    admin_key: str
    cache_master_key_file: Path


def new_api_key() -> str:
    """A key in auth's format: `sk-` + 16 hex digits + `.` + 43 base64url characters."""
    return f"sk-{secrets.token_hex(8)}.{secrets.token_urlsafe(32)}"


def _ensure(path: Path, make: str) -> str:
    if path.is_file():
        return path.read_text(encoding="utf-8").strip()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(make + "\n")
    return make


def ensure_credentials(directory: Path) -> Credentials:
    """Load the secrets from `directory`, creating the missing ones."""
    pepper = directory / PEPPER_FILE
    admin = directory / ADMIN_KEY_FILE
    _ensure(pepper, secrets.token_urlsafe(48))
    key = _ensure(admin, new_api_key())
    master = directory / CACHE_MASTER_KEY_FILE
    _ensure(master, f"k1:{base64.b64encode(secrets.token_bytes(32)).decode()}")
    return Credentials(
        pepper_file=pepper, admin_key_file=admin, admin_key=key, cache_master_key_file=master
    )
