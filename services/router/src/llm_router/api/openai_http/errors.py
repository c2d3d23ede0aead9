"""Errors in OpenAI's JSON shape, from request problems and from LLMService's gRPC statuses."""

from __future__ import annotations

import math
from typing import Any

import grpc

from llm_common.errors import ErrorDetails, parse_error

INVALID_REQUEST = "invalid_request_error"
AUTHENTICATION = "authentication_error"
PERMISSION = "permission_error"
NOT_FOUND = "not_found_error"
RATE_LIMIT = "rate_limit_error"
SERVER = "server_error"

# gRPC status -> (HTTP status, OpenAI error type).
_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: (400, INVALID_REQUEST),
    grpc.StatusCode.OUT_OF_RANGE: (400, INVALID_REQUEST),
    grpc.StatusCode.FAILED_PRECONDITION: (400, INVALID_REQUEST),
    grpc.StatusCode.UNAUTHENTICATED: (401, AUTHENTICATION),
    grpc.StatusCode.PERMISSION_DENIED: (403, PERMISSION),
    grpc.StatusCode.NOT_FOUND: (404, NOT_FOUND),
    grpc.StatusCode.ALREADY_EXISTS: (409, INVALID_REQUEST),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (429, RATE_LIMIT),
    grpc.StatusCode.CANCELLED: (499, INVALID_REQUEST),
    grpc.StatusCode.UNIMPLEMENTED: (501, INVALID_REQUEST),
    grpc.StatusCode.UNAVAILABLE: (503, SERVER),
    grpc.StatusCode.DEADLINE_EXCEEDED: (504, SERVER),
}
# LLMService field paths -> the OpenAI parameter a client sent.
_PARAMS = (
    ("sampling.max_tokens", "max_tokens"),
    ("sampling.temperature", "temperature"),
    ("sampling.top_p", "top_p"),
    ("sampling.top_k", "top_k"),
    ("sampling.stop", "stop"),
    ("sampling.seed", "seed"),
    ("sampling.logprobs", "logprobs"),
    ("sampling.top_logprobs", "top_logprobs"),
    ("sampling.n", "n"),
    ("sampling.presence_penalty", "presence_penalty"),
    ("sampling.frequency_penalty", "frequency_penalty"),
    ("sampling.repetition_penalty", "repetition_penalty"),
    ("sampling.logit_bias", "logit_bias"),
    ("sampling.min_tokens", "min_tokens"),
    ("sampling.min_p", "min_p"),
    ("sampling.stop_token_ids", "stop_token_ids"),
    ("sampling.format", "response_format"),
    ("tool_choice.function_name", "tool_choice"),
    ("tool_choice.mode", "tool_choice"),
    ("inputs", "input"),
)


class OpenAIError(Exception):
    """An error answer: HTTP status, OpenAI's `error` object and extra response headers."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = INVALID_REQUEST,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def invalid(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, INVALID_REQUEST, param, code)


def openai_param(field_path: str) -> str:
    """`sampling.max_tokens` -> `max_tokens`; other paths (messages[0].content) as they are,
    but for a function's `parameters_json`, sent as `parameters`."""
    field_path = field_path.replace(".function.parameters_json", ".function.parameters")
    for proto, param in _PARAMS:
        if (
            field_path == proto
            or field_path.startswith(f"{proto}[")
            or field_path.startswith(f"{proto}.")
        ):
            return param + field_path[len(proto) :]
    return field_path


def from_rpc_error(err: grpc.RpcError) -> OpenAIError:
    """The OpenAI error for a failed LLMService call, keeping field, quota and retry hints."""
    details = parse_error(err)
    status, kind = _BY_CODE.get(details.code, (500, SERVER))
    headers = {}
    if details.retry_after_s is not None:
        headers["retry-after"] = str(max(1, math.ceil(details.retry_after_s)))
    return OpenAIError(
        status,
        _message(details),
        kind,
        _param(details),
        _code(details),
        headers,
    )


def _message(details: ErrorDetails) -> str:
    message = details.message or details.code.name.lower()
    if details.field_violations:
        fields = "; ".join(
            f"{openai_param(v.field)}: {v.description}" for v in details.field_violations[:5]
        )
        message = f"{message}: {fields}"
    return message


def _param(details: ErrorDetails) -> str | None:
    if details.field_violations:
        return openai_param(details.field_violations[0].field)
    return None


def _code(details: ErrorDetails) -> str | None:
    if details.code is grpc.StatusCode.NOT_FOUND and details.resource is not None:
        return f"{details.resource[0]}_not_found"
    if details.code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        reason = details.error_info.reason if details.error_info else ""
        texts = [reason, *(v.description for v in details.quota_violations)]
        budget = any("budget" in text.lower() for text in texts)
        return "insufficient_quota" if budget else "rate_limit_exceeded"
    if details.error_info is not None:
        return details.error_info.reason.lower()
    return details.code.name.lower()
