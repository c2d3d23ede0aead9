"""ext_authz building blocks: credential extraction and the Check responses."""

from __future__ import annotations

import json

import grpc
import pytest
from envoy.service.auth.v3 import attribute_context_pb2, external_auth_pb2

from llm_auth.extauthz import (
    NO_RATE_LIMIT_HEADER,
    AllowedReplies,
    RequestRates,
    allowed,
    credential_from,
    denial,
    denied,
    public,
    request_headers,
    required_scopes,
    serialized_allowed,
)
from llm_auth.principal import CredentialType, KeyLimits, Principal
from llm_common.errors import PermissionDenied, Unauthenticated, Unavailable

KEY = "sk-0123456789abcdef." + "a" * 43
LIMITED = RequestRates(tenant_per_minute=600)  # every key's tenant has a request limit


def test_credential_from_either_header() -> None:
    assert credential_from({"x-api-key": KEY}) == KEY
    assert credential_from({"authorization": f"Bearer {KEY}"}) == KEY
    assert credential_from({"authorization": f"bearer  {KEY} "}) == KEY
    assert credential_from({"authorization": f"Bearer {KEY}", "x-api-key": KEY}) == KEY


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ({}, "CREDENTIAL_MISSING"),
        ({"x-api-key": "  "}, "CREDENTIAL_MISSING"),
        ({"authorization": "Basic abc"}, "CREDENTIAL_MALFORMED"),
        ({"authorization": "Bearer "}, "CREDENTIAL_MALFORMED"),
        ({"authorization": "Bearer a", "x-api-key": "b"}, "CREDENTIAL_AMBIGUOUS"),
    ],
)
def test_credential_problems(headers: dict[str, str], reason: str) -> None:
    with pytest.raises(Unauthenticated) as caught:
        credential_from(headers)
    assert caught.value.reason == reason


def test_headers_from_raw_header_map() -> None:
    http = attribute_context_pb2.AttributeContext.HttpRequest()
    http.header_map.headers.add(key="X-Api-Key", raw_value=KEY.encode())
    assert request_headers(http) == {"x-api-key": KEY}


def test_required_scopes_accept_spaces_and_commas() -> None:
    assert required_scopes({"required_scopes": "a:b, c:d e"}) == ["a:b", "c:d", "e"]
    assert required_scopes({}) == []


def test_allowed_sets_identity_and_removes_credentials() -> None:
    p = Principal(
        "acme",
        "0123456789abcdef",
        CredentialType.API_KEY,
        scopes=("a", "b"),
        limits=KeyLimits(requests_per_minute=60),
    )
    response = allowed(p, LIMITED)
    assert response.status.code == 0
    headers = {h.header.key: h.header.value for h in response.ok_response.headers}
    assert headers == {
        "x-tenant-id": "acme",
        "x-key-id": "0123456789abcdef",
        "x-scopes": "a,b",
        "x-credential-type": "api_key",
    }
    removed = set(response.ok_response.headers_to_remove)
    assert {"authorization", "x-api-key", "x-allowed-models", NO_RATE_LIMIT_HEADER} <= removed
    assert response.dynamic_metadata["tenant"] == "acme"


@pytest.mark.parametrize(
    ("key_limit", "tenant_limit", "unlimited"),
    [
        (60, 600, None),  # both descriptors apply: the header is removed, not set
        (0, 600, "key"),
        (60, 0, "tenant"),
        (0, 0, "key,tenant"),  # nothing to check: the edge calls no rate-limit service
    ],
)
def test_allowed_tells_the_edge_which_request_limits_do_not_apply(
    key_limit: int, tenant_limit: int, unlimited: str | None
) -> None:
    limits = KeyLimits(requests_per_minute=key_limit, tokens_per_minute=5)
    p = Principal("acme", "0123456789abcdef", CredentialType.JWT, limits=limits)
    response = allowed(p, RequestRates(tenant_per_minute=tenant_limit))
    headers = {h.header.key: h.header.value for h in response.ok_response.headers}
    assert headers.get(NO_RATE_LIMIT_HEADER) == unlimited
    removed = NO_RATE_LIMIT_HEADER in response.ok_response.headers_to_remove
    assert removed is (unlimited is None)


def test_public_removes_identity_headers() -> None:
    response = public()
    assert response.status.code == 0
    assert "x-tenant-id" in response.ok_response.headers_to_remove


def test_denials_map_to_http_statuses_with_readable_bodies() -> None:
    d = denial(Unauthenticated("bad key", reason="API_KEY_INVALID"), grpc_request=False)
    response = denied(d)
    assert d.http_status == 401
    assert response.denied_response.status.code == 401
    assert response.status.code == grpc.StatusCode.UNAUTHENTICATED.value[0]
    body = json.loads(response.denied_response.body)
    assert body["error"]["reason"] == "API_KEY_INVALID"
    headers = {h.header.key: h.header.value for h in response.denied_response.headers}
    assert headers["www-authenticate"].startswith("Bearer")

    d = denial(PermissionDenied("no", reason="SCOPE_MISSING"), grpc_request=True)
    response = denied(d)
    assert d.http_status == 403
    assert response.denied_response.body == "no (SCOPE_MISSING)"

    d = denial(Unavailable("down", retry_after_s=1.2), grpc_request=False)
    headers = {h.header.key: h.header.value for h in denied(d).denied_response.headers}
    assert (d.http_status, headers["retry-after"]) == (503, "2")


def test_allowed_replies_are_the_serialized_allowed_response_built_once() -> None:
    replies = AllowedReplies(serialized_allowed, LIMITED)
    p = Principal("acme", "0123456789abcdef", CredentialType.API_KEY, scopes=("a",))
    first = replies.get(p)
    assert external_auth_pb2.CheckResponse.FromString(first) == allowed(p, LIMITED)
    assert (
        replies.get(Principal("acme", "0123456789abcdef", CredentialType.API_KEY, ("a",))) is first
    )
    other = Principal("acme", "fedcba9876543210", CredentialType.API_KEY, scopes=("a",))
    assert external_auth_pb2.CheckResponse.FromString(replies.get(other)) == allowed(other, LIMITED)
    assert len(replies) == 2


def test_allowed_replies_stay_bounded() -> None:
    replies = AllowedReplies(serialized_allowed, LIMITED, max_entries=3)
    principals = [Principal("acme", f"{i:016x}", CredentialType.JWT) for i in range(10)]
    for p in principals:
        assert external_auth_pb2.CheckResponse.FromString(replies.get(p)) == allowed(p, LIMITED)
        assert len(replies) <= 3


def test_headers_are_lower_cased_whatever_their_source() -> None:
    http = attribute_context_pb2.AttributeContext.HttpRequest()
    http.headers["x-api-key"] = KEY
    assert request_headers(http) == {"x-api-key": KEY}
    http.headers["X-Model"] = "m"
    assert request_headers(http) == {"x-api-key": KEY, "x-model": "m"}
