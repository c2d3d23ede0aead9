"""`python -m llm_cache.keyadmin`: the cache's encryption keys (docs/adr/0017).

  new-key ID         print a fresh master key line (`ID:<base64>`) for the key file
  rewrap             wrap every tenant's data keys with the active master key (after a
                     master key rotation; the old key can be retired once this has run)
  rotate-tenant T    a new data key for tenant T (new values use it; older ones still open)

Reads REDIS_URL, CACHE_KEY_PREFIX and CACHE_MASTER_KEY_FILE like the service.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import os
import socket
import sys
from collections.abc import Sequence

from llm_cache.canonical import tenant_tag
from llm_cache.config import Settings
from llm_cache.datakeys import DataKeys
from llm_cache.envelope import new_key_line, read_key_file
from llm_common.audit import AuditEvent, AuditLog, configure_audit
from llm_common.redis_conn import open_client


def _keys(settings: Settings) -> DataKeys:
    path = settings.encryption.master_key_file
    if path is None:
        raise SystemExit("keyadmin: CACHE_MASTER_KEY_FILE is not set")
    client = open_client(settings.redis.url, timeout_s=5.0)
    return DataKeys(client, settings.redis.key_prefix, read_key_file(path))


async def rewrap_all(settings: Settings) -> int:
    """Rewrap every tenant's data keys with the active master key; returns how many changed."""
    keys = _keys(settings)
    tenants = f"{settings.redis.key_prefix}tenants"
    total = 0
    members = await keys.client.smembers(tenants)
    for tag in sorted(m.decode() if isinstance(m, bytes) else m for m in members):
        total += await keys.rewrap(tag)
    await keys.client.aclose()
    return total


async def rotate_tenant(settings: Settings, tenant: str) -> str:
    """A new active data key for `tenant`; returns its id (hex)."""
    keys = _keys(settings)
    key = await keys.rotate(tenant_tag(tenant))
    await keys.client.aclose()
    return key.dek_id.hex()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llm_cache.keyadmin", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("new-key").add_argument("key_id")
    sub.add_parser("rewrap")
    sub.add_parser("rotate-tenant").add_argument("tenant")
    args = parser.parse_args(argv)
    if args.command == "new-key":
        print(new_key_line(args.key_id))
        return 0
    settings = Settings.from_env(os.environ)
    configure_audit(os.environ)  # operator key changes are audited like admin RPCs
    if args.command == "rewrap":
        changed = asyncio.run(rewrap_all(settings))
        _audit("cache.keys.rewrap", "tenants:*", {"changed": str(changed)})
        print(f"rewrapped {changed} data keys")
    else:
        dek_id = asyncio.run(rotate_tenant(settings, args.tenant))
        _audit("cache.keys.rotate", f"tenant:{args.tenant}", {"data_key": dek_id})
        print(f"tenant data key is now {dek_id}")
    return 0


def _audit(action: str, target: str, details: dict[str, str]) -> None:
    """The operator (OS user) on this host, straight against Redis: no key id to name."""
    AuditLog().record(
        AuditEvent(
            action=action,
            actor=f"operator:{getpass.getuser()}",
            actor_tenant="-",
            target=target,
            outcome="OK",
            source=f"cli@{socket.gethostname()}",
            details=details,
        )
    )


if __name__ == "__main__":
    sys.exit(main())
