"""Caller identity from the edge's metadata, and Settings.from_env."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from llm_common.config import ConfigError
from llm_common.errors import PermissionDenied, Unauthenticated
from llm_router.api.identity import Caller, caller_from_metadata
from llm_router.config import Settings
from llm_router.tokens.local import TokenizeMode

from .conftest import model

REQUIRED = {"TOKENIZER_SERVICE_ADDR": "tok:1", "BILLING_SERVICE_ADDR": "bill:1",
            "AUTH_SERVICE_ADDR": "auth:1", "CACHE_SERVICE_ADDR": "cache:1"}  # fmt: skip


def test_caller_from_edge_headers() -> None:
    caller = caller_from_metadata(
        [
            ("x-tenant-id", "acme"),
            ("x-key-id", "0123456789abcdef"),
            ("x-scopes", "completion:write, model:demo tier:small"),
            ("x-allowed-models", "demo,other"),
            ("x-llm-region", "eu-west, us-east,bad region!"),
            ("x-tenant-id", "ignored-second-value"),
            ("bin-header-bin", b"\x00"),
        ],
        "x-llm-region",
    )
    assert caller.tenant_id == "acme"
    assert caller.key_id == "0123456789abcdef"
    assert caller.billing_key_id == "0123456789abcdef"
    assert caller.scopes == {"completion:write", "model:demo", "tier:small"}
    assert caller.model_scopes == {"demo", "other"}
    assert caller.tier_scopes == {"small"}
    assert caller.regions == ("eu-west", "us-east")


def test_jwt_callers_are_billed_without_a_key() -> None:
    caller = caller_from_metadata([("x-tenant-id", "acme"), ("x-key-id", "jwt:user@example")], "r")
    assert caller.key_id == "jwt:user@example"
    assert caller.billing_key_id == ""


@pytest.mark.parametrize(
    "metadata",
    [[], [("x-tenant-id", "")], [("x-tenant-id", "bad tenant")], [("x-tenant-id", "a:b")],
     [("x-tenant-id", "t"), ("x-key-id", "k" * 300)]],
)  # fmt: skip
def test_missing_or_malformed_identity_is_unauthenticated(metadata: list[tuple[str, str]]) -> None:
    with pytest.raises(Unauthenticated) as exc:
        caller_from_metadata(metadata, "x-llm-region")
    assert exc.value.code == grpc.StatusCode.UNAUTHENTICATED


def test_scopes_and_model_permissions() -> None:
    admin = Caller("t", "k", frozenset({"admin"}))
    admin.require_scope("completion:write")
    writer = Caller("t", "k", frozenset({"completion:write"}))
    with pytest.raises(PermissionDenied) as exc:
        writer.require_scope("embedding:read")
    assert exc.value.reason == "SCOPE_MISSING"
    small, large = model("a", tier="small", aliases=["alias-a"]), model("b", tier="large")
    scoped = Caller("t", "k", frozenset({"model:alias-a"}))
    assert scoped.may_use(small, frozenset())
    assert not scoped.may_use(large, frozenset())
    assert not writer.may_use(large, frozenset({"small"}))
    with pytest.raises(PermissionDenied) as exc:
        writer.require_model(large, frozenset({"small"}))
    assert exc.value.reason == "MODEL_NOT_ALLOWED"


def test_settings_defaults_and_overrides() -> None:
    settings = Settings.from_env(REQUIRED)
    assert settings.server.grpc_port == 50053
    assert settings.server.metrics_port == 9153
    assert settings.downstream.auth_addr == "auth:1"
    assert settings.routing.balancer == "expected_wait"
    assert settings.policies_config == Path("infra/config/policies.yaml")
    custom = Settings.from_env(
        {
            **REQUIRED,
            "AUTH_SERVICE_ADDR": "off",
            "CACHE_SERVICE_ADDR": "none",
            "ROUTER_BALANCER": "round_robin",
            "ROUTER_BLOCK_TOKENS": "32",
            "INFERENCE_MESH_ADDR": "127.0.0.1:15001",
            "ROUTER_MAX_MESSAGES": "8",
            "ROUTER_QUOTA_FAIL_OPEN": "false",
            "ROUTER_TOKENIZE": "Auto",
        }
    )
    assert custom.downstream.auth_addr is None
    assert custom.downstream.cache_addr is None
    assert custom.downstream.quota_fail_open is False
    assert custom.routing.balancer == "round_robin"
    assert custom.routing.block_tokens == 32
    assert custom.routing.mesh_addr == "127.0.0.1:15001"
    assert custom.limits.max_messages == 8
    assert settings.tokenize is TokenizeMode.SPECULATE  # the service decides; work starts early
    assert custom.tokenize is TokenizeMode.AUTO
    assert settings.http_port is None  # the OpenAI listener is off unless asked for
    http = Settings.from_env({**REQUIRED, "ROUTER_HTTP_PORT": "8053"})
    assert (http.http_host, http.http_port) == ("127.0.0.1", 8053)


@pytest.mark.parametrize(
    ("overrides", "variable"),
    [
        ({"TOKENIZER_SERVICE_ADDR": ""}, "TOKENIZER_SERVICE_ADDR"),
        ({"CACHE_SERVICE_ADDR": ""}, "CACHE_SERVICE_ADDR"),
        ({"ROUTER_BALANCER": "random"}, "ROUTER_BALANCER"),
        ({"ROUTER_BLOCK_TOKENS": "0"}, "ROUTER_BLOCK_TOKENS"),
        ({"ROUTER_LOAD_INTERVAL_MS": "10"}, "ROUTER_LOAD_INTERVAL_MS"),
        ({"ROUTER_IMBALANCE_REL": "0.5"}, "ROUTER_IMBALANCE_REL"),
        ({"ROUTER_EXCLUDE_S": "100"}, "ROUTER_EXCLUDE_MAX_S"),
        ({"ROUTER_CALL_TIMEOUT_S": "0"}, "ROUTER_CALL_TIMEOUT_S"),
        ({"ROUTER_MAX_MESSAGES": "0"}, "ROUTER_MAX_MESSAGES"),
        ({"ROUTER_PREFILL_WEIGHT": "-1"}, "ROUTER_PREFILL_WEIGHT"),
        ({"ROUTER_HTTP_PORT": "http"}, "ROUTER_HTTP_PORT"),
        ({"ROUTER_TOKENIZE": "remote"}, "ROUTER_TOKENIZE"),
    ],
)
def test_bad_settings_name_the_variable(overrides: dict[str, str], variable: str) -> None:
    with pytest.raises(ConfigError) as exc:
        Settings.from_env({**REQUIRED, **overrides})
    assert str(exc.value).startswith(variable)
