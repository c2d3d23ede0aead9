"""Scope and model authorization."""

from __future__ import annotations

import pytest

from llm_auth.principal import CredentialType, Principal, authorize
from llm_common.errors import PermissionDenied


def principal(scopes: tuple[str, ...] = (), models: tuple[str, ...] = ()) -> Principal:
    return Principal("acme", "k", CredentialType.API_KEY, scopes=scopes, allowed_models=models)


def test_required_scopes_must_all_be_held() -> None:
    p = principal(scopes=("completion:write",))
    authorize(p, ["completion:write"])
    with pytest.raises(PermissionDenied) as caught:
        authorize(p, ["completion:write", "embedding:read"])
    assert caught.value.reason == "SCOPE_MISSING"
    assert "embedding:read" in caught.value.message


def test_no_model_restriction_allows_every_model() -> None:
    authorize(principal(), [], "anything")


def test_allowed_models_and_model_scopes_restrict() -> None:
    p = principal(scopes=("model:beta",), models=("alpha",))
    assert p.model_restriction == ("alpha", "beta")
    authorize(p, [], "alpha")
    authorize(p, [], "beta")
    with pytest.raises(PermissionDenied) as caught:
        authorize(p, [], "gamma")
    assert caught.value.reason == "MODEL_NOT_ALLOWED"


def test_wildcard_model_scope_allows_all() -> None:
    authorize(principal(scopes=("model:*",)), [], "gamma")


def test_admin_flag() -> None:
    assert principal(scopes=("admin",)).is_admin
    assert not principal(scopes=("completion:write",)).is_admin
