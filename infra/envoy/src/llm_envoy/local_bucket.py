"""What the optional edge token bucket (`edge.local_rate_limit`) tells a refused caller (issue
32, 6a): the same as the rate-limit service's refusals, fixed at render time.

The local_ratelimit filter has no body or status-details setting, but its
`response_headers_to_add` go on its own 429s only (not on auth's or the rate-limit service's):
`retry-after` (one fill interval, whole seconds) and `grpc-status-details-bin`
(google.rpc.Status RESOURCE_EXHAUSTED with QuotaFailure and RetryInfo: a gRPC answer from
Envoy is trailers-only, so these headers are the trailers a gRPC client reads). The message
comes from local-reply mappers picked by the response's code details (`bucket_reply`): the
grpc-message for gRPC callers (a header set on the filter would be overwritten by Envoy's
bare "local_rate_limited"), a JSON status for REST callers; /v1 clients get OpenAI's
rate-limit object from the listener's 429 mapper (`llm_envoy.listeners`)."""

from __future__ import annotations

import base64
import math
from typing import Any

from google.protobuf import duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

from llm_envoy.policy_model import LocalRateLimit

Config = dict[str, Any]
# Envoy's response code details for the local bucket's refusals.
LOCAL_RATE_LIMITED = "local_rate_limited"
SUBJECT = "edge"  # the bucket is the whole Envoy's, not a key's or a tenant's


def retry_after_s(bucket: LocalRateLimit) -> int:
    """A refused caller waits one fill interval (at least a second)."""
    return max(1, math.ceil(bucket.fill_interval_s))


def refusal_message(bucket: LocalRateLimit) -> str:
    return (
        "The gateway is over its request rate "
        f"({bucket.tokens_per_fill} per {bucket.fill_interval_s:g} s); "
        f"retry after {retry_after_s(bucket)} s."
    )


def status_details(bucket: LocalRateLimit) -> str:
    """Base64 google.rpc.Status for `grpc-status-details-bin`."""
    wait = duration_pb2.Duration(seconds=retry_after_s(bucket))
    quota = error_details_pb2.QuotaFailure(
        violations=[
            error_details_pb2.QuotaFailure.Violation(
                subject=SUBJECT,
                description=f"{bucket.tokens_per_fill} per {bucket.fill_interval_s:g} s",
            )
        ]
    )
    status = status_pb2.Status(code=code_pb2.RESOURCE_EXHAUSTED, message=refusal_message(bucket))
    for detail in (quota, error_details_pb2.RetryInfo(retry_delay=wait)):
        status.details.add().Pack(detail)
    return base64.b64encode(status.SerializeToString()).decode("ascii")


def refusal_headers(bucket: LocalRateLimit) -> list[Config]:
    """`response_headers_to_add` of the local_ratelimit filter."""
    values = {
        "retry-after": str(retry_after_s(bucket)),
        "grpc-status-details-bin": status_details(bucket),
    }
    return [
        {"header": {"key": k, "value": v}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}
        for k, v in values.items()
    ]


def bucket_reply(bucket: LocalRateLimit | None) -> list[Config]:
    """A local-reply mapper: the bucket's 429 to a non-gRPC caller off /v1 (REST through the
    transcoder) says why instead of Envoy's bare "local_rate_limited". Picked by response code
    details (CEL), so the rate-limit service's own 429 bodies are left alone."""
    if bucket is None:
        return []
    details = {
        "extension_filter": {
            "name": "envoy.access_loggers.extension_filters.cel",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.access_loggers.filters.cel.v3"
                ".ExpressionFilter",
                "expression": f"response.code_details == '{LOCAL_RATE_LIMITED}'",
            },
        }
    }
    message = refusal_message(bucket)
    rest = {"code": code_pb2.RESOURCE_EXHAUSTED, "message": message, "details": []}
    return [
        {
            # A gRPC caller's local reply body becomes its grpc-message.
            "filter": {"and_filter": {"filters": [details, _grpc(invert=False)]}},
            "body_format_override": {"text_format_source": {"inline_string": message}},
        },
        {
            "filter": {"and_filter": {"filters": [details, _grpc(invert=True)]}},
            "body_format_override": {"json_format": rest, "content_type": "application/json"},
        },
    ]


def _grpc(*, invert: bool) -> Config:
    match = {"name": "content-type", "string_match": {"prefix": "application/grpc"}}
    return {"header_filter": {"header": {**match, "invert_match": invert}}}
