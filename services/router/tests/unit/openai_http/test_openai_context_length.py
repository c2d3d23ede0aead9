"""Issue 32, finding 6: a prompt over the context window is OpenAI's `context_length_exceeded`
(a 400 whose message litellm and other OpenAI-compatible clients recognise), not a bare
invalid_argument."""

from __future__ import annotations

import grpc
import pytest

from llm_common.errors import ServiceError
from llm_router.api.openai_http.errors import from_rpc_error
from llm_router.api.validation import ContextLengthExceeded, check_max_tokens
from llmapi.common.v1 import common_pb2

pytestmark = pytest.mark.security


def rpc_error(error: ServiceError) -> grpc.aio.AioRpcError:
    """The error a client sees for `error` raised in a server behind ErrorInterceptor."""
    status = error.to_proto()
    trailing = grpc.aio.Metadata(("grpc-status-details-bin", status.SerializeToString()))
    return grpc.aio.AioRpcError(error.code, grpc.aio.Metadata(), trailing, details=error.message)


@pytest.mark.parametrize(
    ("prompt_tokens", "max_tokens", "param"),
    [(2048, None, "messages"), (2000, 100, "max_tokens")],
)
def test_over_the_context_window_is_context_length_exceeded(
    prompt_tokens: int, max_tokens: int | None, param: str
) -> None:
    sampling = common_pb2.SamplingParams()
    if max_tokens is not None:
        sampling.max_tokens = max_tokens
    with pytest.raises(ContextLengthExceeded) as raised:
        check_max_tokens(sampling, prompt_tokens, 2048, 256, prompt_field="messages")
    assert raised.value.code is grpc.StatusCode.INVALID_ARGUMENT
    err = from_rpc_error(rpc_error(raised.value))
    assert (err.status, err.type, err.code, err.param) == (
        400,
        "invalid_request_error",
        "context_length_exceeded",
        param,
    )
    # litellm's ContextWindowExceededError test looks for this phrase in the message.
    assert "This model's maximum context length is 2048 tokens" in err.message
    assert err.body()["error"]["code"] == "context_length_exceeded"


def test_a_prompt_that_fits_is_no_error() -> None:
    assert check_max_tokens(common_pb2.SamplingParams(), 100, 2048, 256, prompt_field="x") == 256
