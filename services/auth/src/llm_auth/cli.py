"""Operator commands: `python -m llm_auth keys create|list|revoke|generate`, against Redis."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import re
import socket
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from llm_auth import validation
from llm_auth.apikeys import generate_key
from llm_auth.authenticator import now_ms
from llm_auth.config import Settings
from llm_auth.convert import duration_s
from llm_auth.keyspace import Keyspace
from llm_auth.keystore import KeyStore, NewKey, key_wait
from llm_auth.principal import KeyLimits
from llm_auth.records import KeyRecord
from llm_auth.redis_guard import RedisGuard, StoreUnavailable, connect
from llm_common.audit import AuditEvent, AuditLog, configure_audit
from llm_common.config import ConfigError
from llm_common.errors import FieldViolation, InvalidArgument
from llm_common.validation import Violations
from llmapi.auth.v1 import auth_service_pb2 as pb

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
_DURATION = re.compile(r"(?P<n>\d+)(?P<unit>[smhd]?)")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="python -m llm_auth", description=__doc__)
    commands = root.add_subparsers(dest="group", required=True)
    keys = commands.add_parser("keys", help="manage API keys").add_subparsers(
        dest="command", required=True
    )
    create = keys.add_parser("create", help="create a key and print its secret once")
    create.add_argument("--tenant", required=True)
    create.add_argument("--name", default="")
    create.add_argument("--scope", action="append", default=[], help="repeatable")
    create.add_argument("--model", action="append", default=[], help="allowed model, repeatable")
    create.add_argument("--rpm", type=int, default=0, help="requests per minute (0 = unlimited)")
    create.add_argument("--tpm", type=int, default=0, help="tokens per minute (0 = unlimited)")
    create.add_argument("--concurrency", type=int, default=0, help="max concurrent requests")
    create.add_argument("--ttl", default="0", help="lifetime, e.g. 3600, 90m, 12h, 30d (0 = none)")
    create.add_argument("--label", action="append", default=[], help="key=value, repeatable")
    listing = keys.add_parser("list", help="list a tenant's keys (never secrets)")
    listing.add_argument("--tenant", required=True)
    listing.add_argument("--include-revoked", action="store_true")
    revoke = keys.add_parser("revoke", help="revoke a key at once")
    revoke.add_argument("key_id")
    keys.add_parser("generate", help="print a fresh key without storing it (for bootstrap)")
    return root


def main(argv: Sequence[str], environ: Mapping[str, str], out: TextIO = sys.stdout) -> int:
    """Run one command; the exit status (0 ok, 1 failed, 2 bad usage or configuration)."""
    args = parser().parse_args(argv)
    if args.command == "generate":
        out.write(generate_key().text + "\n")
        return EXIT_OK
    try:
        settings = Settings.from_env(environ)
        configure_audit(environ)  # operator changes are audited like the RPCs' ones
        return asyncio.run(_run(args, settings, out))
    except ConfigError as exc:
        print(f"llm-auth: configuration error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except InvalidArgument as exc:
        for v in exc.violations:
            print(f"llm-auth: {v.field}: {v.description}", file=sys.stderr)
        return EXIT_USAGE
    except StoreUnavailable:
        print("llm-auth: redis is unreachable", file=sys.stderr)
        return EXIT_FAILED


async def _run(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    client = connect(settings.redis)
    try:
        guard = RedisGuard(client, settings.redis)
        keyspace = Keyspace(settings.redis.prefix)
        store = KeyStore(guard, keyspace, settings.pepper, wait=key_wait(settings.redis))
        try:
            if args.command == "create":
                return await _create(store, args, out)
            if args.command == "list":
                return await _list(store, args.tenant, args.include_revoked, out)
            return await _revoke(store, args.key_id, out)
        finally:
            await store.aclose()
    finally:
        await client.aclose()


async def _create(store: KeyStore, args: argparse.Namespace, out: TextIO) -> int:
    request = _create_request(args)
    validation.check_create(request)
    spec = NewKey(
        tenant_id=request.tenant_id,
        name=request.name,
        scopes=tuple(dict.fromkeys(request.scopes)),
        allowed_models=tuple(dict.fromkeys(request.allowed_models)),
        limits=KeyLimits(args.rpm, args.tpm, args.concurrency),
        labels=dict(request.labels),
        ttl_ms=request.ttl.ToMilliseconds(),
    )
    record, key = await store.create(spec, now_ms())
    details = {"key_id": record.key_id, "name": spec.name, "scopes": ",".join(spec.scopes)}
    _audit("key.create", f"tenant:{spec.tenant_id}", "OK", details)
    _print(out, {**_record_json(record), "secret": key.text})
    print("llm-auth: store the secret now; it cannot be shown again", file=sys.stderr)
    return EXIT_OK


def _create_request(args: argparse.Namespace) -> pb.CreateKeyRequest:
    labels = dict(item.partition("=")[::2] for item in args.label)
    return pb.CreateKeyRequest(
        tenant_id=args.tenant,
        name=args.name,
        scopes=args.scope,
        allowed_models=args.model,
        limits=pb.KeyLimits(
            requests_per_minute=args.rpm,
            tokens_per_minute=args.tpm,
            max_concurrent_requests=args.concurrency,
        ),
        labels=labels,
        ttl=duration_s(_seconds(args.ttl)),
    )


def _seconds(text: str) -> float:
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        violation = FieldViolation("ttl", "must look like 3600, 90m, 12h or 30d")
        raise InvalidArgument([violation])
    return int(match["n"]) * _UNIT_S[match["unit"]]


async def _list(store: KeyStore, tenant: str, include_revoked: bool, out: TextIO) -> int:
    v = Violations()
    validation.check_tenant(v, "tenant", tenant)
    v.raise_if_any()
    offset: int | None = 0
    while offset is not None:
        page = await store.list(
            tenant,
            offset=offset,
            page_size=validation.MAX_PAGE_SIZE,
            include_revoked=include_revoked,
        )
        for record in page.records:
            _print(out, _record_json(record))
        offset = page.next_offset
    return EXIT_OK


async def _revoke(store: KeyStore, key_id: str, out: TextIO) -> int:
    v = Violations()
    validation.check_key_id(v, "key_id", key_id)
    v.raise_if_any()
    record = await store.revoke(key_id, now_ms())
    _audit("key.revoke", f"key:{key_id}", "OK" if record else "NOT_FOUND")
    if record is None:
        print(f"llm-auth: no key {key_id}", file=sys.stderr)
        return EXIT_FAILED
    _print(out, _record_json(record))
    return EXIT_OK


def _audit(action: str, target: str, outcome: str, details: dict[str, str] | None = None) -> None:
    """The operator (OS user) on this host, straight against Redis: no key id to name."""
    event = AuditEvent(
        action=action,
        actor=f"operator:{getpass.getuser()}",
        actor_tenant="-",
        target=target,
        outcome=outcome,
        source=f"cli@{socket.gethostname()}",
        details=details or {},
    )
    AuditLog().record(event)


def _record_json(record: KeyRecord) -> dict[str, Any]:
    return {
        "key_id": record.key_id,
        "tenant_id": record.tenant_id,
        "name": record.name,
        "scopes": list(record.scopes),
        "allowed_models": list(record.allowed_models),
        "limits": {
            "requests_per_minute": record.limits.requests_per_minute,
            "tokens_per_minute": record.limits.tokens_per_minute,
            "max_concurrent_requests": record.limits.max_concurrent,
        },
        "labels": dict(record.labels),
        "secret_hint": record.secret_hint,
        "created_at_ms": record.created_at_ms,
        "expires_at_ms": record.expires_at_ms or None,
        "revoked_at_ms": record.revoked_at_ms or None,
    }


def _print(out: TextIO, data: Mapping[str, Any]) -> None:
    out.write(json.dumps(data, sort_keys=True) + "\n")
