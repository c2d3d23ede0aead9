"""AuthServicer: validate, call the domain, build the response (no logic of its own)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from llm_auth import validation
from llm_auth.admin import AdminGate
from llm_auth.authenticator import Authenticator
from llm_auth.config import Settings
from llm_auth.convert import (
    api_key_pb,
    duration_s,
    limits_from_pb,
    principal_pb,
    timestamp_ms,
)
from llm_auth.key_admin import KeyAdmin
from llm_auth.keystore import NewKey
from llm_auth.principal import Principal, authorize
from llm_auth.quotas import Quotas
from llm_common.audit import AuditEvent, AuditLog, caller_of
from llm_common.errors import ServiceError
from llmapi.auth.v1 import auth_service_pb2 as pb
from llmapi.auth.v1 import auth_service_pb2_grpc as pb_grpc

Context = grpc.aio.ServicerContext[Any, Any]
T = TypeVar("T")


class AuthServicer(pb_grpc.AuthServiceServicer):
    """llmapi.auth.v1.AuthService. Key administration needs an `admin` credential in the call
    metadata; the other RPCs are for services inside the mesh."""

    def __init__(
        self,
        authenticator: Authenticator,
        gate: AdminGate,
        admin: KeyAdmin,
        quotas: Quotas,
        settings: Settings,
        audit: AuditLog | None = None,
    ) -> None:
        self._audit = audit or AuditLog()
        self._auth = authenticator
        self._gate = gate
        self._admin = admin
        self._quotas = quotas
        self._settings = settings

    # Method names are the contract's RPC names, hence the noqa N802.
    async def Authenticate(  # noqa: N802
        self, request: pb.AuthenticateRequest, context: Context
    ) -> pb.AuthenticateResponse:
        validation.start_authenticate(request).raise_if_any()
        principal = await self._auth.authenticate(request.credential)
        authorize(principal, request.required_scopes, request.model)
        return pb.AuthenticateResponse(principal=principal_pb(principal))

    async def CreateKey(  # noqa: N802
        self, request: pb.CreateKeyRequest, context: Context
    ) -> pb.CreateKeyResponse:
        validation.check_create(request)
        spec = NewKey(
            tenant_id=request.tenant_id,
            name=request.name,
            scopes=tuple(dict.fromkeys(request.scopes)),
            allowed_models=tuple(dict.fromkeys(request.allowed_models)),
            limits=limits_from_pb(request.limits),
            labels=dict(request.labels),
            ttl_ms=request.ttl.ToMilliseconds(),
        )
        details: dict[str, str] = {"name": request.name, "scopes": ",".join(spec.scopes)}

        async def create(caller: Principal) -> pb.CreateKeyResponse:
            record, key = await self._admin.create(caller, spec)
            details["key_id"] = record.key_id
            return pb.CreateKeyResponse(key=api_key_pb(record), secret=key.text)

        return await self._audited(
            context, "key.create", f"tenant:{request.tenant_id}", create, details
        )

    async def ListKeys(  # noqa: N802
        self, request: pb.ListKeysRequest, context: Context
    ) -> pb.ListKeysResponse:
        offset = validation.check_list(request)
        page_size = request.page_size or validation.DEFAULT_PAGE_SIZE

        async def list_keys(caller: Principal) -> Any:
            return await self._admin.list(
                caller, request.tenant_id, offset, page_size, request.include_revoked
            )

        page = await self._audited(context, "key.list", f"tenant:{request.tenant_id}", list_keys)
        token = "" if page.next_offset is None else validation.encode_page_token(page.next_offset)
        return pb.ListKeysResponse(
            keys=[api_key_pb(r) for r in page.records], next_page_token=token
        )

    async def RevokeKey(  # noqa: N802
        self, request: pb.RevokeKeyRequest, context: Context
    ) -> pb.RevokeKeyResponse:
        validation.check_key_ref(request)

        async def revoke(caller: Principal) -> pb.RevokeKeyResponse:
            return pb.RevokeKeyResponse(key=api_key_pb(await self._admin.revoke(caller, key_id)))

        key_id = request.key_id
        return await self._audited(context, "key.revoke", f"key:{key_id}", revoke)

    async def RotateKey(  # noqa: N802
        self, request: pb.RotateKeyRequest, context: Context
    ) -> pb.RotateKeyResponse:
        grace_s = validation.check_rotate(request)

        async def rotate(caller: Principal) -> pb.RotateKeyResponse:
            record, key = await self._admin.rotate(caller, request.key_id, grace_s)
            return pb.RotateKeyResponse(
                key=api_key_pb(record),
                secret=key.text,
                old_secret_expires_at=timestamp_ms(record.previous_expires_at_ms),
            )

        details = {"grace_s": f"{grace_s:g}"}
        return await self._audited(context, "key.rotate", f"key:{request.key_id}", rotate, details)

    async def ForgetTenant(  # noqa: N802
        self, request: pb.ForgetTenantRequest, context: Context
    ) -> pb.ForgetTenantResponse:
        validation.check_tenant_ref(request)

        async def forget(caller: Principal) -> pb.ForgetTenantResponse:
            deleted = await self._admin.forget_tenant(caller, request.tenant_id)
            return pb.ForgetTenantResponse(keys_deleted=deleted)

        target = f"tenant:{request.tenant_id}"
        return await self._audited(context, "tenant.forget", target, forget)

    async def _audited(
        self,
        context: Context,
        action: str,
        target: str,
        run: Callable[[Principal], Awaitable[T]],
        details: dict[str, str] | None = None,
    ) -> T:
        """`run` as the admin the call's credential names, audited whatever the outcome
        (a refused credential too: who tried to administer keys matters most)."""
        caller: Principal | None = None
        outcome = "INTERNAL"
        try:
            caller = await self._gate.caller(context)
            result = await run(caller)
            outcome = "OK"
            return result
        except ServiceError as err:
            outcome = err.code.name
            raise
        finally:
            who = caller_of(context.invocation_metadata(), context.peer())
            self._audit.record(
                AuditEvent(
                    action=action,
                    actor=caller.key_id if caller else "-",
                    actor_tenant=caller.tenant_id if caller else "-",
                    target=target,
                    outcome=outcome,
                    source=who.source,
                    details={**(details or {}), **who.source_details()},
                )
            )

    async def ReserveTokens(  # noqa: N802
        self, request: pb.ReserveTokensRequest, context: Context
    ) -> pb.ReserveTokensResponse:
        validation.check_reserve(request)
        grant = await self._quotas.reserve_tokens(
            request.tenant_id, request.key_id, request.tokens, request.reservation_id
        )
        return pb.ReserveTokensResponse(
            reservation_id=request.reservation_id,
            remaining=grant.remaining,
            reset_after=duration_s(grant.reset_after_s),
            limit=grant.limit,
            enforced=grant.enforced,
        )

    async def RefundTokens(  # noqa: N802
        self, request: pb.RefundTokensRequest, context: Context
    ) -> pb.RefundTokensResponse:
        validation.check_refund(request)
        remaining = await self._quotas.refund_tokens(
            request.tenant_id, request.key_id, request.reservation_id, request.tokens
        )
        return pb.RefundTokensResponse(remaining=remaining)

    async def AcquireConcurrency(  # noqa: N802
        self, request: pb.AcquireConcurrencyRequest, context: Context
    ) -> pb.AcquireConcurrencyResponse:
        s = self._settings
        ttl_s = validation.check_acquire(request, s.default_lease_ttl_s, s.max_lease_ttl_s)
        grant = await self._quotas.acquire(
            request.tenant_id, request.key_id, request.lease_id, ttl_s
        )
        response = pb.AcquireConcurrencyResponse(
            lease_id=request.lease_id,
            in_use=grant.in_use,
            limit=grant.limit,
            enforced=grant.enforced,
        )
        if grant.expires_at_ms:
            response.expires_at.CopyFrom(timestamp_ms(grant.expires_at_ms))
        return response

    async def ReleaseConcurrency(  # noqa: N802
        self, request: pb.ReleaseConcurrencyRequest, context: Context
    ) -> pb.ReleaseConcurrencyResponse:
        validation.check_release(request)
        released = await self._quotas.release(request.tenant_id, request.key_id, request.lease_id)
        return pb.ReleaseConcurrencyResponse(released=released)
