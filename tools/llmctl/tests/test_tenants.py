"""`llmctl tenants forget` against scripted auth, cache and billing services on one port: the
order of the calls, the admin key, the confirmation, and a refused step as one line."""

from __future__ import annotations

import io
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from llmapi.auth.v1 import auth_service_pb2 as auth_pb
from llmapi.auth.v1 import auth_service_pb2_grpc as auth_grpc
from llmapi.billing.v1 import billing_service_pb2 as billing_pb
from llmapi.billing.v1 import billing_service_pb2_grpc as billing_grpc
from llmapi.cache.v1 import cache_service_pb2 as cache_pb
from llmapi.cache.v1 import cache_service_pb2_grpc as cache_grpc
from llmctl.cli import main


class Calls:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []  # service, tenant, authorization
        self.billing_open = False

    def record(self, service: str, tenant: str, context: grpc.ServicerContext) -> None:
        auth = dict(context.invocation_metadata()).get("authorization", "")
        self.seen.append((service, tenant, str(auth)))


class Auth(auth_grpc.AuthServiceServicer):
    def __init__(self, calls: Calls) -> None:
        self.calls = calls

    def ForgetTenant(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        self.calls.record("auth", request.tenant_id, context)
        return auth_pb.ForgetTenantResponse(keys_deleted=2)


class Cache(cache_grpc.CacheServiceServicer):
    def __init__(self, calls: Calls) -> None:
        self.calls = calls

    def ForgetTenant(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        self.calls.record("cache", request.tenant_id, context)
        return cache_pb.ForgetTenantResponse(entries_removed=5, keys_destroyed=True)


class Billing(billing_grpc.BillingServiceServicer):
    def __init__(self, calls: Calls) -> None:
        self.calls = calls

    def ForgetTenant(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        self.calls.record("billing", request.tenant_id, context)
        if self.calls.billing_open:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "requests in flight")
        return billing_pb.ForgetTenantResponse(ledger_records_deleted=7, usage_rows_deleted=6)


@pytest.fixture
def platform() -> Iterator[tuple[str, Calls]]:
    calls = Calls()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    auth_grpc.add_AuthServiceServicer_to_server(Auth(calls), server)  # type: ignore[abstract]
    cache_grpc.add_CacheServiceServicer_to_server(Cache(calls), server)  # type: ignore[abstract]
    billing_grpc.add_BillingServiceServicer_to_server(Billing(calls), server)  # type: ignore[abstract]
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", calls
    server.stop(grace=None)


def run(addr: str, *args: str) -> tuple[int, str, str]:
    env = {"LLM_API_ADDR": addr, "LLM_API_KEY": "sk-user", "LLM_ADMIN_KEY": "sk-admin"}
    out, err = io.StringIO(), io.StringIO()
    code = main(list(args), env, stdin=io.StringIO(""), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_forget_calls_auth_then_cache_then_billing_as_admin(
    platform: tuple[str, Calls],
) -> None:
    addr, calls = platform
    code, out, err = run(addr, "tenants", "forget", "acme", "--yes")
    assert (code, err) == (0, "")
    assert calls.seen == [(s, "acme", "Bearer sk-admin") for s in ("auth", "cache", "billing")]
    assert out.splitlines() == [
        "auth     2 API keys deleted",
        "cache    5 cached entries removed, data keys destroyed",
        "billing  7 request records deleted, 6 usage rows unlinked from their requests "
        "(totals kept)",
        "tenant acme forgotten",
    ]


def test_forget_needs_confirmation_and_reports_a_refused_step(
    platform: tuple[str, Calls],
) -> None:
    addr, calls = platform
    code, _, err = run(addr, "tenants", "forget", "acme")
    assert code == 2
    assert err == "llmctl: erasing tenant 'acme' cannot be undone: add --yes\n"
    assert calls.seen == []
    calls.billing_open = True
    code, out, _ = run(addr, "tenants", "forget", "acme", "--yes")
    assert code == 1
    assert "billing  failed: FAILED_PRECONDITION: requests in flight" in out
    assert out.endswith("run the command again to finish\n")
