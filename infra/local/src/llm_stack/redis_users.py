"""The stack's Redis users (llm_common.redis_acl): one per service that keeps state in Redis,
plus `probe` (PING only) for health checks.

Passwords are generated once into the secrets directory, one `redis-<user>.env` file each
(`REDIS_USERNAME=...`, `REDIS_PASSWORD=...`, mode 0600; compose reads them as env_file and an
operator can `source` one to run a service's command line), and reused on every restart. The
ACL file Redis loads (`redis-users.acl`) is rewritten at each start from them: it holds only
SHA-256 hashes of 256-bit random passwords, so it is 0644 (a container's redis user reads it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from llm_common.redis_acl import (
    ADMIN_USER,
    PROBE_USER,
    SERVICE_ACLS,
    RedisUser,
    acl_file,
    new_password,
    redis_url_for,
)

ACL_FILE = "redis-users.acl"


@dataclass(frozen=True, slots=True)
class StackRedisUsers:
    """The services' users, the probe's password and where the ACL file was written."""

    services: dict[str, RedisUser]
    probe_password: str
    acl_path: Path
    admin_password: str | None = None  # the local cluster's administration only

    def url_for(self, base_url: str, service: str) -> str:
        """`base_url` (no credentials) with `service`'s user."""
        return redis_url_for(base_url, self.services[service])

    def probe_url(self, base_url: str) -> str:
        return redis_url_for(base_url, RedisUser(PROBE_USER, self.probe_password, ""))


def stack_prefixes(prefix: str = "") -> dict[str, str]:
    """Each service's key prefix in the stack (LLM_REDIS_PREFIX prepended)."""
    return {name: f"{prefix}{acl.default_prefix}" for name, acl in SERVICE_ACLS.items()}


def env_file(directory: Path, user: str) -> Path:
    return directory / f"redis-{user}.env"


def _read_or_create(path: Path, user: str) -> str:
    """The password kept in `path`, created (0600, never overwritten) when missing."""
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            name, _, value = line.partition("=")
            if name == "REDIS_PASSWORD" and value:
                return value
        raise ValueError(f"{path} holds no REDIS_PASSWORD line")
    password = new_password()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(f"REDIS_USERNAME={user}\nREDIS_PASSWORD={password}\n")
    return password


def ensure_redis_users(
    directory: Path, prefix: str = "", *, admin: bool = False
) -> StackRedisUsers:
    """Load (or create) every user's password in `directory`; write the ACL file for the
    stack's prefixes (with `admin`, also the user that joins and replicates a local cluster)."""
    services = {
        name: RedisUser(name, _read_or_create(env_file(directory, name), name), key_prefix)
        for name, key_prefix in stack_prefixes(prefix).items()
    }
    probe = _read_or_create(env_file(directory, PROBE_USER), PROBE_USER)
    admin_password = _read_or_create(env_file(directory, ADMIN_USER), ADMIN_USER) if admin else None
    path = directory / ACL_FILE
    temporary = path.with_suffix(".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(acl_file(services, probe, admin_password))
    temporary.chmod(0o644)  # whatever the umask: hashes only (see the module docstring)
    temporary.replace(path)
    return StackRedisUsers(services, probe, path, admin_password)
