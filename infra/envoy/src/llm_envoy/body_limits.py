"""Request body limits at the edge (issue 32, findings 2 and 3) and the 413 each protocol gets.

Envoy streams bodies through with flow control, except where a filter needs them whole (the
grpc_json_transcoder buffers a unary REST body before transcoding it). Without a limit a 50 MB
POST was buffered in full and reached the router, whose "message larger than max" came back as
a retryable 429; an oversized `/v1` body was refused by the router mid-upload, which Envoy
sometimes turned into a retryable 503 (upstream reset).

The `buffer` filter holds each request's body up to `edge.limits.max_request_body_bytes` and
answers 413 beyond it, before auth or the router is asked: memory per request is bounded by the
limit, and the router never sees an oversized body. It runs before ext_authz: after it, a
body that arrived whole during the auth check (HTTP/2 lets a client send up to its stream
window meanwhile) would be handed on as complete and pass unchecked. Every public request is
unary, so holding its body costs no streaming. The answer per protocol (local-reply mappers,
first match wins):

- `/v1/...` (OpenAI clients): 413 with OpenAI's error object, `invalid_request_error`;
- gRPC (`content-type: application/grpc...`): trailers-only RESOURCE_EXHAUSTED, gRPC's own
  code for a message over the size limit (Envoy would say UNKNOWN for 413), non-retryable;
- REST/JSON through the transcoder: 413 with the transcoder's error shape
  (`{"code": 8, "message", "details": []}`: google.rpc.Status as JSON).

Buffer filter chosen over `body_size_limit`: the latter logs every refusal at error level
with the request target, query string included (a flood of log lines and a secret in them).
"""

from __future__ import annotations

from typing import Any

from llm_envoy.policy_model import Limits

Config = dict[str, Any]
BUFFER = "envoy.filters.http.buffer"
# Envoy's response code details for a body over the buffer filter's limit.
TOO_LARGE_DETAILS = "request_payload_too_large"
RESOURCE_EXHAUSTED = 8  # google.rpc.Code


def buffer_filter(limits: Limits) -> list[Config]:
    """The edge's body limit (none when the policy sets it to null)."""
    if limits.max_request_body_bytes is None:
        return []
    config = {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer",
        "max_request_bytes": limits.max_request_body_bytes,
    }
    return [{"name": BUFFER, "typed_config": config}]


def too_large_message(limit: int) -> str:
    return f"Request body too large: the limit is {limit} bytes."


def _is_413() -> Config:
    return {
        "status_code_filter": {
            "comparison": {
                "op": "EQ",
                "value": {"default_value": 413, "runtime_key": "edge.body_limit_413"},
            }
        }
    }


def _header_prefix(name: str, prefix: str) -> Config:
    return {"header_filter": {"header": {"name": name, "string_match": {"prefix": prefix}}}}


def _when(*filters: Config) -> Config:
    return {"and_filter": {"filters": [*filters]}}


def too_large_replies(limits: Limits) -> list[Config]:
    """Local-reply mappers for 413, per protocol (see the module docstring)."""
    if limits.max_request_body_bytes is None:
        return []
    message = too_large_message(limits.max_request_body_bytes)
    openai = {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": None,
            "code": "request_too_large",
        }
    }
    grpc_status = {
        "header": {"key": "grpc-status", "value": str(RESOURCE_EXHAUSTED)},
        "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
    }
    rest = {"code": RESOURCE_EXHAUSTED, "message": message, "details": []}
    return [
        {
            "filter": _when(_is_413(), _header_prefix(":path", "/v1/")),
            "body_format_override": {"json_format": openai, "content_type": "application/json"},
        },
        {
            "filter": _when(_is_413(), _header_prefix("content-type", "application/grpc")),
            "headers_to_add": [grpc_status],
            "body_format_override": {"text_format_source": {"inline_string": message}},
        },
        {
            "filter": _is_413(),
            "body_format_override": {"json_format": rest, "content_type": "application/json"},
        },
    ]
