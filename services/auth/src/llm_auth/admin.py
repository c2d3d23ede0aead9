"""Who may administer keys: callers whose credential (in call metadata) has the `admin` scope.

An admin of the admin tenant manages every tenant; any other admin only its own tenant.
"""

from __future__ import annotations

from typing import Any

import grpc

from llm_auth.authenticator import Authenticator
from llm_auth.extauthz import credential_from
from llm_auth.principal import Principal
from llm_common.errors import NotFound, PermissionDenied

Context = grpc.aio.ServicerContext[Any, Any]


class AdminGate:
    """Authenticates the caller of an admin RPC and checks its reach."""

    def __init__(self, authenticator: Authenticator, admin_tenant: str) -> None:
        self._auth = authenticator
        self._admin_tenant = admin_tenant

    async def caller(self, context: Context) -> Principal:
        """The calling admin; Unauthenticated or PermissionDenied otherwise."""
        metadata = {
            key.lower(): value
            for key, value in (context.invocation_metadata() or ())
            if isinstance(value, str)
        }
        principal = await self._auth.authenticate(credential_from(metadata))
        if not principal.is_admin:
            raise PermissionDenied(
                "this call needs a credential with the 'admin' scope", reason="ADMIN_SCOPE_REQUIRED"
            )
        return principal

    def may_manage(self, admin: Principal, tenant_id: str) -> bool:
        return admin.tenant_id in (self._admin_tenant, tenant_id)

    def check_tenant(self, admin: Principal, tenant_id: str) -> None:
        """PermissionDenied unless `admin` may manage `tenant_id`."""
        if not self.may_manage(admin, tenant_id):
            raise PermissionDenied(
                "admin credential may not manage this tenant", reason="TENANT_FORBIDDEN"
            )

    def check_erasure(self, admin: Principal, tenant_id: str) -> None:
        """Only an admin of the admin tenant erases a tenant, and never the admin tenant."""
        if admin.tenant_id != self._admin_tenant:
            raise PermissionDenied(
                "erasing a tenant needs an admin of the admin tenant", reason="TENANT_FORBIDDEN"
            )
        if tenant_id == self._admin_tenant:
            raise PermissionDenied("the admin tenant cannot be erased", reason="TENANT_FORBIDDEN")

    def check_key(self, admin: Principal, tenant_id: str, key_id: str) -> None:
        """NotFound (not revealing other tenants' keys) unless `admin` may manage it."""
        if not self.may_manage(admin, tenant_id):
            raise NotFound("api key", key_id)
