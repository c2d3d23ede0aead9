"""`tenants forget T`: erase a tenant everywhere (docs/adr/0017), with an admin key.

Auth goes first, so that no request of the tenant starts meanwhile; then the cache (entries
and data keys) and billing (per-request records; totals stay). Every step is idempotent: after
a failure, running the command again finishes the job.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

import grpc

from llmapi.auth.v1 import auth_service_pb2 as auth_pb
from llmapi.auth.v1 import auth_service_pb2_grpc as auth_grpc
from llmapi.billing.v1 import billing_service_pb2 as billing_pb
from llmapi.billing.v1 import billing_service_pb2_grpc as billing_grpc
from llmapi.cache.v1 import cache_service_pb2 as cache_pb
from llmapi.cache.v1 import cache_service_pb2_grpc as cache_grpc
from llmctl.connection import Credentials, UsageError
from llmctl.errors import one_line


@dataclass(frozen=True, slots=True)
class Step:
    name: str
    call: Callable[[grpc.Channel, str, Any], str]  # channel, tenant, call kwargs -> summary


def _auth(channel: grpc.Channel, tenant: str, kw: Any) -> str:
    reply = auth_grpc.AuthServiceStub(channel).ForgetTenant(
        auth_pb.ForgetTenantRequest(tenant_id=tenant), **kw
    )
    return f"{reply.keys_deleted} API keys deleted"


def _cache(channel: grpc.Channel, tenant: str, kw: Any) -> str:
    reply = cache_grpc.CacheServiceStub(channel).ForgetTenant(
        cache_pb.ForgetTenantRequest(tenant_id=tenant), **kw
    )
    shredded = "data keys destroyed" if reply.keys_destroyed else "no data keys (not encrypted)"
    return f"{reply.entries_removed} cached entries removed, {shredded}"


def _billing(channel: grpc.Channel, tenant: str, kw: Any) -> str:
    reply = billing_grpc.BillingServiceStub(channel).ForgetTenant(
        billing_pb.ForgetTenantRequest(tenant_id=tenant), **kw
    )
    return (
        f"{reply.ledger_records_deleted} request records deleted, "
        f"{reply.usage_rows_deleted} usage rows unlinked from their requests (totals kept)"
    )


STEPS = (Step("auth", _auth), Step("cache", _cache), Step("billing", _billing))


def forget(args: argparse.Namespace, channel: grpc.Channel, creds: Credentials, out: TextIO) -> int:
    if not args.yes:
        raise UsageError(f"erasing tenant {args.tenant!r} cannot be undone: add --yes")
    kw = {"metadata": creds.metadata(admin=True), "timeout": args.timeout}
    for step in STEPS:
        try:
            summary = step.call(channel, args.tenant, kw)
        except grpc.RpcError as err:
            out.write(f"{step.name:<8} failed: {one_line(err)}\n")
            out.write("nothing after this step was erased; run the command again to finish\n")
            return 1
        out.write(f"{step.name:<8} {summary}\n")
    out.write(f"tenant {args.tenant} forgotten\n")
    return 0


def add_parser(sub: Any) -> argparse.ArgumentParser:
    tenants = sub.add_parser("tenants", help="tenants (needs an admin key)").add_subparsers(
        dest="tenants_command", required=True, metavar="ACTION"
    )
    p: argparse.ArgumentParser = tenants.add_parser(
        "forget", help="erase a tenant: keys, cached entries, per-request records"
    )
    p.add_argument("tenant")
    p.add_argument("--yes", action="store_true", help="confirm: this cannot be undone")
    return p
