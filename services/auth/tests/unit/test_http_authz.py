"""Parsing and framing of auth's HTTP ext_authz listener (no sockets)."""

from __future__ import annotations

import pytest

from llm_auth.extauthz import NO_RATE_LIMIT_HEADER, RequestRates, denial
from llm_auth.http_authz import (
    PUBLIC_REPLY,
    REMOVE_HEADER,
    BadRequest,
    allowed_reply,
    denied_reply,
    parse_head,
    response,
    split_path,
)
from llm_auth.principal import CredentialType, Principal
from llm_common.errors import Unauthenticated


def head(target: str, *headers: str) -> bytes:
    return "\r\n".join([f"POST {target} HTTP/1.1", "host: auth", *headers]).encode()


def test_path_carries_the_original_path_and_the_routes_scopes() -> None:
    assert split_path("/authz/llmapi.llm.v1.LLMService/Chat") == (
        "/llmapi.llm.v1.LLMService/Chat",
        (),
    )
    assert split_path("/authz;scopes=completion:write,admin/v1/chat?x=1") == (
        "/v1/chat?x=1",
        ("completion:write", "admin"),
    )


@pytest.mark.parametrize(
    "target",
    ["/other/v1/chat", "/authz", "/authzv1/chat", "/authz;scopes=a", "*"],
)
def test_paths_outside_the_contract_are_refused(target: str) -> None:
    with pytest.raises(BadRequest) as caught:
        split_path(target)
    assert caught.value.status == 400


def test_a_client_path_cannot_add_scopes_or_remove_them() -> None:
    # The client's path only follows the prefix Envoy was configured with.
    assert split_path("/authz/;scopes=/x") == ("/;scopes=/x", ())
    assert split_path("/authz;scopes=admin/authz/x")[1] == ("admin",)


def test_the_listeners_own_health_path_is_not_a_check() -> None:
    assert parse_head(head("/healthz")).health
    assert not parse_head(head("/authz/healthz")).health


def test_headers_are_lower_cased_and_repeats_joined() -> None:
    request = parse_head(head("/authz/a", "X-API-Key: sk-1", "x-model: m", "X-Model: n"))
    assert request.path == "/a"
    assert request.headers["x-api-key"] == "sk-1"
    assert request.headers["x-model"] == "m,n"
    assert request.body_bytes == 0


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"POST /authz/a\r\nhost: a", 400),  # no protocol
        (b"POST /authz/a HTTP/2\r\nhost: a", 400),
        (b"PO ST /authz/a HTTP/1.1", 400),
        (b"POST /authz/a HTTP/1.1\r\nno colon here", 400),
        (b"POST /authz/a HTTP/1.1\r\nbad name: v", 400),
        (b"POST /authz/a HTTP/1.1\r\ncontent-length: -1", 400),
        (b"POST /authz/a HTTP/1.1\r\ntransfer-encoding: chunked", 400),
        (b"POST /authz/a HTTP/1.1\r\ncontent-length: 99999999", 413),
    ],
)
def test_malformed_requests_are_refused_with_a_status(raw: bytes, status: int) -> None:
    with pytest.raises(BadRequest) as caught:
        parse_head(raw)
    assert caught.value.status == status


def parse_reply(reply: bytes) -> tuple[int, dict[str, str], bytes]:
    head_bytes, _, body = reply.partition(b"\r\n\r\n")
    status_line, *lines = head_bytes.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines)
    assert int(headers["content-length"]) == len(body)
    return int(status_line.split(" ")[1]), headers, body


def test_allowed_reply_sets_identity_and_removes_credentials() -> None:
    p = Principal("acme", "0123456789abcdef", CredentialType.API_KEY, scopes=("a", "b"))
    status, headers, body = parse_reply(allowed_reply(p, RequestRates(tenant_per_minute=60)))
    assert status == 200
    assert body == b""
    assert headers["x-tenant-id"] == "acme"
    assert headers["x-scopes"] == "a,b"
    removed = headers[REMOVE_HEADER].split(",")
    assert {"authorization", "x-api-key", "x-allowed-models"} <= set(removed)
    assert "x-tenant-id" not in removed
    # The key has no request limit, its tenant one: the edge may skip the key's descriptor.
    assert headers[NO_RATE_LIMIT_HEADER] == "key"
    assert NO_RATE_LIMIT_HEADER not in removed


def test_public_reply_removes_identity_headers() -> None:
    status, headers, _ = parse_reply(PUBLIC_REPLY)
    assert status == 200
    assert "x-tenant-id" in headers[REMOVE_HEADER].split(",")
    assert "x-tenant-id" not in headers


def test_denied_reply_has_the_status_headers_and_body() -> None:
    d = denial(Unauthenticated("bad key", reason="API_KEY_INVALID"), grpc_request=True)
    status, headers, body = parse_reply(denied_reply(d))
    assert status == 401
    assert headers["www-authenticate"].startswith("Bearer")
    assert body == b"bad key (API_KEY_INVALID)"


def test_a_header_value_with_a_line_break_is_never_written() -> None:
    with pytest.raises(ValueError, match="line break"):
        response(200, [("x-tenant-id", "a\r\nx-scopes: admin")])
