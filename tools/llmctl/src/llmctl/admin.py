"""`keys create|list|revoke` (AuthService) and `usage` (BillingService), with an admin key."""

from __future__ import annotations

import argparse
import datetime
from typing import TextIO

import grpc
from google.protobuf import duration_pb2, timestamp_pb2

from llmapi.auth.v1 import auth_service_pb2 as auth_pb
from llmapi.auth.v1 import auth_service_pb2_grpc as auth_grpc
from llmapi.billing.v1 import billing_service_pb2 as billing_pb
from llmapi.billing.v1 import billing_service_pb2_grpc as billing_grpc
from llmctl.connection import Credentials

MICROS = 1_000_000
_GRANULARITY = {
    "hour": billing_pb.GRANULARITY_HOUR,
    "day": billing_pb.GRANULARITY_DAY,
    "total": billing_pb.GRANULARITY_TOTAL,
}


def _limits(args: argparse.Namespace) -> auth_pb.KeyLimits:
    return auth_pb.KeyLimits(
        requests_per_minute=args.rpm,
        tokens_per_minute=args.tpm,
        max_concurrent_requests=args.concurrency,
    )


def keys_create(
    args: argparse.Namespace, channel: grpc.Channel, creds: Credentials, out: TextIO
) -> int:
    request = auth_pb.CreateKeyRequest(
        tenant_id=args.tenant,
        name=args.name,
        scopes=args.scope or ["completion:write", "embedding:read"],
        allowed_models=args.model,
        limits=_limits(args),
    )
    if args.ttl_hours:
        request.ttl.CopyFrom(duration_pb2.Duration(seconds=round(args.ttl_hours * 3600)))
    stub = auth_grpc.AuthServiceStub(channel)
    reply = stub.CreateKey(request, metadata=creds.metadata(admin=True), timeout=args.timeout)
    out.write(f"key id   {reply.key.key_id} (tenant {reply.key.tenant_id})\n")
    out.write(f"secret   {reply.secret}\n")
    out.write("The secret is shown only now; keep it in a secret store.\n")
    return 0


def _when(stamp: timestamp_pb2.Timestamp) -> str:
    if not stamp.seconds and not stamp.nanos:
        return "-"
    return stamp.ToDatetime(datetime.UTC).strftime("%Y-%m-%d %H:%M")


def keys_list(
    args: argparse.Namespace, channel: grpc.Channel, creds: Credentials, out: TextIO
) -> int:
    stub = auth_grpc.AuthServiceStub(channel)
    token = ""
    out.write(f"{'KEY ID':<18} {'NAME':<20} {'CREATED':<16} {'REVOKED':<16} SCOPES\n")
    while True:
        request = auth_pb.ListKeysRequest(
            tenant_id=args.tenant, page_token=token, include_revoked=args.include_revoked
        )
        reply = stub.ListKeys(request, metadata=creds.metadata(admin=True), timeout=args.timeout)
        for key in reply.keys:
            out.write(
                f"{key.key_id:<18} {key.name[:20]:<20} {_when(key.created_at):<16} "
                f"{_when(key.revoked_at):<16} {','.join(key.scopes)}\n"
            )
        token = reply.next_page_token
        if not token:
            return 0


def keys_revoke(
    args: argparse.Namespace, channel: grpc.Channel, creds: Credentials, out: TextIO
) -> int:
    stub = auth_grpc.AuthServiceStub(channel)
    request = auth_pb.RevokeKeyRequest(key_id=args.key_id)
    reply = stub.RevokeKey(request, metadata=creds.metadata(admin=True), timeout=args.timeout)
    out.write(f"revoked {reply.key.key_id} at {_when(reply.key.revoked_at)}\n")
    return 0


def _timestamp(moment: datetime.datetime) -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(moment)
    return stamp


def usage(args: argparse.Namespace, channel: grpc.Channel, creds: Credentials, out: TextIO) -> int:
    now = datetime.datetime.now(datetime.UTC)
    request = billing_pb.GetUsageRequest(
        tenant_id=args.tenant,
        key_id=args.key or "",
        model=args.model or "",
        start_time=_timestamp(now - datetime.timedelta(days=args.days)),
        end_time=_timestamp(now + datetime.timedelta(hours=1)),
        granularity=_GRANULARITY[args.granularity],
    )
    stub = billing_grpc.BillingServiceStub(channel)
    reply = stub.GetUsage(request, metadata=creds.metadata(admin=True), timeout=args.timeout)
    header = (
        f"{'FROM (UTC)':<16} {'REQUESTS':>9} {'PROMPT':>10} {'COMPLETION':>11} {'CACHED':>9} COST"
    )
    out.write(header + "\n")
    rows = [*(b for b in reply.buckets if args.granularity != "total"), reply.total]
    for bucket in rows:
        start = _when(bucket.start_time) if bucket is not reply.total else "total"
        cost = f"{bucket.cost_micros / MICROS:.6f} {reply.currency}"
        out.write(
            f"{start:<16} {bucket.requests:>9} {bucket.prompt_tokens:>10} "
            f"{bucket.completion_tokens:>11} {bucket.cached_tokens:>9} {cost}\n"
        )
    return 0
