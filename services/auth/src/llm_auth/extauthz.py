"""Envoy ext_authz (envoy.service.auth.v3.Authorization/Check) over the Authenticator."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.auth.v3 import external_auth_pb2 as authz_pb
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2
from google.rpc import status_pb2

from llm_auth.apikeys import MalformedKeyError, looks_like_key, parse_key
from llm_auth.authenticator import Authenticator
from llm_auth.failure_throttle import FailureThrottle, ThrottleSettings, retry_after_s
from llm_auth.metrics import AuthMetrics
from llm_auth.principal import Principal, authorize
from llm_common.errors import QuotaExceeded, QuotaViolation, ServiceError, Unauthenticated

Context = grpc.aio.ServicerContext[Any, Any]
CREDENTIAL_HEADERS = ("authorization", "x-api-key")
# Which of the edge's request-rate descriptors have no limit for this caller ("key", "tenant"):
# the edge drops those descriptors, and calls no rate-limit service when none is left. Absent
# (an older auth, a failed check), every descriptor is sent, as before.
NO_RATE_LIMIT_HEADER = "x-no-rate-limit"
IDENTITY_HEADERS = (
    "x-tenant-id",
    "x-key-id",
    "x-scopes",
    "x-credential-type",
    "x-allowed-models",
    NO_RATE_LIMIT_HEADER,
)
MODEL_HEADER = "x-model"
# The client's content type as the edge copies it for the check (the check request must not
# carry `application/grpc` itself; see llm_envoy.filters), else content-type.
CONTENT_TYPE_HEADER = "x-authz-content-type"
MAX_MODEL_CHARS = 256
METADATA_NAMESPACE = "envoy.filters.http.ext_authz"  # where Envoy files dynamic_metadata
_OVERWRITE = base_pb2.HeaderValueOption.HeaderAppendAction.OVERWRITE_IF_EXISTS_OR_ADD
# gRPC status of the denial -> HTTP status Envoy answers with.
_HTTP_STATUS = {
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
}
# HTTP status -> OpenAI's error type and code (None: the denial's reason, lower-cased), as the
# router's OpenAI front end answers the same statuses.
_OPENAI_ERRORS: dict[int, tuple[str, str | None]] = {
    400: ("invalid_request_error", None),
    401: ("authentication_error", "invalid_api_key"),
    403: ("permission_error", None),
    429: ("rate_limit_error", "rate_limit_exceeded"),
    503: ("server_error", None),
}
# The OpenAI-compatible API: denials there carry OpenAI's error object.
OPENAI_PATH_PREFIX = "/v1/"
# Where the HTTP check learns the client's address: Envoy's edge (use_remote_address) sets the
# first for external clients, overwriting any a client sent, and appends the peer to the second.
EXTERNAL_ADDRESS_HEADER = "x-envoy-external-address"
FORWARDED_FOR_HEADER = "x-forwarded-for"
THROTTLED_REASON = "AUTH_FAILURES_THROTTLED"


class AuthThrottled(QuotaExceeded):
    """RESOURCE_EXHAUSTED + QuotaFailure + RetryInfo: too many failed authentications."""

    reason = THROTTLED_REASON

    def __init__(self, subject: str, wait_s: float, settings: ThrottleSettings) -> None:
        retry = retry_after_s(wait_s)
        limit = f"more than {settings.limit} failed authentications in {settings.window_s:g} s"
        super().__init__(
            [QuotaViolation(subject, limit)],
            retry_after_s=retry,
            message=f"too many failed authentications; retry after {retry:g} s",
        )


def client_address(headers: Mapping[str, str], source: str = "") -> str:
    """The caller's address: Envoy's source attribute (gRPC Check), else the edge's
    x-envoy-external-address, else the last x-forwarded-for hop (the one the edge appended);
    "" when none is known (such callers are throttled per key id only)."""
    if source:
        return source
    external = headers.get(EXTERNAL_ADDRESS_HEADER, "").strip()
    if external:
        return external
    return headers.get(FORWARDED_FOR_HEADER, "").rpartition(",")[2].strip()


def _key_id(credential: str | None) -> str | None:
    if credential is None or not looks_like_key(credential):
        return None
    try:
        return parse_key(credential).key_id
    except MalformedKeyError:
        return None


def request_headers(http: Any) -> dict[str, str]:
    """Lower-cased request headers, from `headers` or (raw header mode) `header_map`."""
    if http.headers:
        headers: dict[str, str] = dict(http.headers)
        if all(key.islower() for key in headers):  # as Envoy sends them: no copy needed
            return headers
        return {key.lower(): value for key, value in headers.items()}
    return {
        h.key.lower(): h.raw_value.decode("utf-8", "replace") or h.value
        for h in http.header_map.headers
    }


def credential_from(headers: Mapping[str, str]) -> str:
    """The credential of `authorization: Bearer …` or `x-api-key`; Unauthenticated if it is
    missing, malformed, or two different ones were sent."""
    bearer = _bearer(headers.get("authorization"))
    api_key = (headers.get("x-api-key") or "").strip() or None
    if bearer is not None and api_key is not None and bearer != api_key:
        raise Unauthenticated("send one credential, not two", reason="CREDENTIAL_AMBIGUOUS")
    credential = bearer or api_key
    if credential is None:
        raise Unauthenticated(
            "missing credential: send 'authorization: Bearer <key>' or 'x-api-key: <key>'",
            reason="CREDENTIAL_MISSING",
        )
    return credential


def _bearer(value: str | None) -> str | None:
    if value is None:
        return None
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthenticated(
            "authorization header must be 'Bearer <credential>'", reason="CREDENTIAL_MALFORMED"
        )
    return token.strip()


def required_scopes(extensions: Mapping[str, str]) -> list[str]:
    """Scopes a route demands, from its context extension `required_scopes` (space or comma
    separated)."""
    return extensions.get("required_scopes", "").replace(",", " ").split()


def _header(key: str, value: str) -> Any:
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=key, value=value), append_action=_OVERWRITE
    )


@dataclass(frozen=True, slots=True)
class RequestRates:
    """The request-per-minute limits auth's rate-limit service applies beside each key's own
    (0 = unlimited): what Check needs to tell the edge which descriptors can be skipped."""

    tenant_per_minute: int = 0

    def unlimited(self, principal: Principal) -> tuple[str, ...]:
        """The descriptor levels with no limit for `principal`: the same limits the rate-limit
        service looks up (a key's record, or the JWT defaults the principal carries)."""
        levels = []
        if principal.limits.requests_per_minute <= 0:
            levels.append("key")
        if self.tenant_per_minute <= 0:
            levels.append("tenant")
        return tuple(levels)


def identity_headers(principal: Principal, rates: RequestRates) -> list[tuple[str, str]]:
    """What the upstream (and the edge's rate-limit filter) learns about the caller."""
    headers = [
        ("x-tenant-id", principal.tenant_id),
        ("x-key-id", principal.key_id),
        ("x-scopes", ",".join(principal.scopes)),
        ("x-credential-type", principal.credential_type.value),
    ]
    if principal.model_restriction:
        headers.append(("x-allowed-models", ",".join(principal.model_restriction)))
    unlimited = rates.unlimited(principal)
    if unlimited:
        headers.append((NO_RATE_LIMIT_HEADER, ",".join(unlimited)))
    return headers


def allowed(principal: Principal, rates: RequestRates) -> Any:
    """OK: identity headers set (overwriting anything the client sent), credentials dropped,
    identity in dynamic metadata for rate-limit descriptors."""
    set_headers = identity_headers(principal, rates)
    set_names = {name for name, _ in set_headers}
    metadata = struct_pb2.Struct()
    metadata.update(
        {
            "tenant": principal.tenant_id,
            "key_id": principal.key_id,
            "credential_type": principal.credential_type.value,
        }
    )
    ok = authz_pb.OkHttpResponse(
        headers=[_header(name, value) for name, value in set_headers],
        headers_to_remove=[
            *CREDENTIAL_HEADERS,
            *(h for h in IDENTITY_HEADERS if h not in set_names),
        ],
    )
    return authz_pb.CheckResponse(
        status=status_pb2.Status(code=0), ok_response=ok, dynamic_metadata=metadata
    )


def public() -> Any:
    """OK without identity (health checks); identity headers a client sent are removed."""
    ok = authz_pb.OkHttpResponse(headers_to_remove=list(IDENTITY_HEADERS))
    return authz_pb.CheckResponse(status=status_pb2.Status(code=0), ok_response=ok)


def serialized_allowed(principal: Principal, rates: RequestRates) -> bytes:
    """Check's OK reply, serialized."""
    reply: bytes = allowed(principal, rates).SerializeToString()
    return reply


class AllowedReplies:
    """Serialized OK replies by principal, as `build` makes them (Check's CheckResponse, or
    the HTTP listener's reply). A principal's reply never changes, and building it (headers,
    a Struct) took more time than the rest of Check; the bound keeps memory flat when many
    distinct JWT subjects pass (a full cache is simply emptied)."""

    def __init__(
        self,
        build: Callable[[Principal, RequestRates], bytes],
        rates: RequestRates,
        max_entries: int = 10_000,
    ) -> None:
        self._rates = rates
        self._build = build
        self._max_entries = max_entries
        self._replies: dict[Principal, bytes] = {}

    def __len__(self) -> int:
        return len(self._replies)

    def get(self, principal: Principal) -> bytes:
        reply = self._replies.get(principal)
        if reply is None:
            if len(self._replies) >= self._max_entries:
                self._replies.clear()
            reply = self._replies[principal] = self._build(principal, self._rates)
        return reply


@dataclass(frozen=True, slots=True)
class Denial:
    """A failed check as both transports answer it."""

    error: ServiceError
    http_status: int
    headers: list[tuple[str, str]]
    body: str


def denial(err: ServiceError, *, grpc_request: bool, openai: bool = False) -> Denial:
    """The HTTP answer to a failed check, with a body clients can read: JSON for HTTP
    clients (OpenAI's error object on the OpenAI API, `openai`), the plain message for gRPC
    ones (it becomes grpc-message)."""
    http_status = _HTTP_STATUS.get(err.code, 403)
    reason = str(getattr(err, "reason", err.code.name))
    headers = [("content-type", "text/plain" if grpc_request else "application/json")]
    if http_status == 401:
        headers.append(("www-authenticate", 'Bearer realm="llm-api"'))
    retry_after = getattr(err, "retry_after_s", None)
    if retry_after is not None:
        headers.append(("retry-after", str(max(1, math.ceil(retry_after)))))
    if grpc_request:
        body = f"{err.message} ({reason})"
    elif openai:
        body = _openai_body(http_status, err, reason)
    else:
        body = _json_body(http_status, err, reason)
    return Denial(err, http_status, headers, body)


def denied(d: Denial) -> Any:
    """The CheckResponse for a failed check."""
    return authz_pb.CheckResponse(
        # The rich status (ErrorInfo, QuotaFailure, RetryInfo) for callers that read it.
        status=d.error.to_proto(),
        denied_response=authz_pb.DeniedHttpResponse(
            status=http_status_pb2.HttpStatus(code=d.http_status),
            headers=[_header(name, value) for name, value in d.headers],
            body=d.body,
        ),
    )


def _openai_body(http_status: int, err: ServiceError, reason: str) -> str:
    """OpenAI's {"error": {"message", "type", "param", "code"}}, with OpenAI's codes where it
    has one (so OpenAI SDKs and litellm classify the error), else our reason."""
    kind, code = _OPENAI_ERRORS.get(http_status, ("server_error", None))
    error = {"message": err.message, "type": kind, "param": None, "code": code or reason.lower()}
    return json.dumps({"error": error})


def _json_body(http_status: int, err: ServiceError, reason: str) -> str:
    error = {"code": http_status, "status": err.code.name, "reason": reason, "message": err.message}
    return json.dumps({"error": error})


class AuthorizationServicer:
    """Check: public paths pass; otherwise the credential must verify and carry the route's
    `required_scopes` and allow the requested model (`x-model` header or the route's `model`
    context extension). Replies are serialized CheckResponses (see `method_handlers`)."""

    def __init__(
        self,
        authenticator: Authenticator,
        public_paths: Sequence[str],
        metrics: AuthMetrics,
        rates: RequestRates,
        throttle: FailureThrottle | None = None,
    ) -> None:
        self._auth = authenticator
        # None: no throttling (Settings turn it on by default for the server).
        self._throttle = throttle or FailureThrottle(ThrottleSettings(limit=0))
        self._public = frozenset(public_paths)
        self._metrics = metrics
        self.rates = rates
        self._allowed = AllowedReplies(serialized_allowed, rates)
        self._public_reply: bytes = public().SerializeToString()

    def method_handlers(self) -> dict[str, grpc.RpcMethodHandler[Any, bytes]]:
        """Check's handler: the request is parsed as usual, the reply is sent as given."""
        handler: grpc.RpcMethodHandler[Any, bytes] = grpc.unary_unary_rpc_method_handler(
            self.Check, request_deserializer=authz_pb.CheckRequest.FromString
        )
        return {"Check": handler}

    async def Check(self, request: Any, context: Context) -> bytes:  # noqa: N802
        http = request.attributes.request.http
        extensions = request.attributes.context_extensions
        headers = request_headers(http)
        source = request.attributes.source.address.socket_address.address
        decision = await self.decide(
            http.path,
            headers,
            required_scopes(extensions),
            extensions.get("model", ""),
            client=client_address(headers, source),
        )
        if decision is None:
            return self._public_reply
        if isinstance(decision, Denial):
            reply: bytes = denied(decision).SerializeToString()
            return reply
        return self._allowed.get(decision)

    async def decide(
        self,
        path: str,
        headers: Mapping[str, str],
        scopes: Sequence[str],
        route_model: str,
        *,
        client: str = "",
    ) -> Principal | Denial | None:
        """The caller's principal; a Denial; or None for a public path (no credential needed).
        The model is the route's (`route_model`) or the `x-model` header's; `client` is the
        caller's address, for failed-authentication throttling."""
        if path.partition("?")[0] in self._public:
            self._metrics.ext_authz_answer(200)
            return None
        wait = self._throttle.address_wait_s(client)
        if wait > 0:
            return self._deny(self._throttled("address", client, wait), headers, path)
        credential: str | None = None
        try:
            credential = credential_from(headers)
            principal = await self._auth.authenticate(credential)
            model = route_model or headers.get(MODEL_HEADER, "")
            # A model name longer than any real one cannot be allowed; cut it to bound work.
            authorize(principal, scopes, model[:MAX_MODEL_CHARS])
        except Unauthenticated as err:
            key_id = _key_id(credential)
            key_wait = self._throttle.failed(client, key_id)
            if key_wait > 0 and key_id is not None:
                return self._deny(self._throttled("key", key_id, key_wait), headers, path)
            return self._deny(err, headers, path)
        except ServiceError as err:
            return self._deny(err, headers, path)
        self._metrics.ext_authz_answer(200)
        return principal

    def _throttled(self, scope: str, subject: str, wait_s: float) -> AuthThrottled:
        self._metrics.auth_throttled(scope)
        return AuthThrottled(f"{scope}:{subject}", wait_s, self._throttle.settings)

    def _deny(self, err: ServiceError, headers: Mapping[str, str], path: str) -> Denial:
        content_type = headers.get(CONTENT_TYPE_HEADER) or headers.get("content-type", "")
        grpc_request = content_type.startswith("application/grpc")
        d = denial(err, grpc_request=grpc_request, openai=path.startswith(OPENAI_PATH_PREFIX))
        self._metrics.ext_authz_answer(d.http_status)
        return d
