"""Hostile values for every new parameter: translation answers a 400 or a request that builds,
never another exception (which the listener would turn into a 500)."""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm_router.api.openai_http import translate
from llm_router.api.openai_http.errors import OpenAIError
from llmapi.llm.v1 import llm_service_pb2 as pb

FUZZ = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from((0, -1, 1, 2, 17, 300, 2**31, 2**63, 10**400, 0.5, -0.0)),
    st.sampled_from((math.nan, math.inf, -math.inf)),
    st.sampled_from(("", "auto", "none", "required", "function", "json_schema", "\ud800", "7")),
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=12,
)
SCHEMA_NAME = st.sampled_from(("s", "a b", "")) | SCALARS
FORMATS = st.one_of(
    JSON,
    st.fixed_dictionaries(
        {"type": st.sampled_from(("text", "json_object", "json_schema")) | JSON},
        optional={
            "json_schema": JSON
            | st.fixed_dictionaries(
                {"name": SCHEMA_NAME}, optional={"schema": JSON, "strict": JSON}
            )
        },
    ),
)
FUNCTION = st.fixed_dictionaries(
    {"name": st.sampled_from(("f", "g", "bad name")) | SCALARS},
    optional={"parameters": JSON, "description": JSON, "strict": JSON},
)
TOOLS = JSON | st.lists(
    st.fixed_dictionaries({"type": st.just("function") | JSON, "function": FUNCTION | JSON}),
    max_size=3,
)
CALL = st.fixed_dictionaries(
    {"id": JSON, "type": st.just("function") | JSON, "function": FUNCTION | JSON},
    optional={"arguments": JSON},
)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(("user", "assistant", "tool", "function")) | JSON},
    optional={
        "content": JSON,
        "tool_calls": st.lists(CALL, max_size=2) | JSON,
        "tool_call_id": JSON,
    },
)
CHAT_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "messages": st.lists(MESSAGE, min_size=1, max_size=3) | JSON,
    "response_format": FORMATS,
    "tools": TOOLS,
    "tool_choice": JSON | st.just({"type": "function", "function": {"name": "f"}}),
    "logit_bias": JSON | st.dictionaries(st.sampled_from(("1", "x", "-2", "99999999999")), JSON),
    **{
        name: JSON
        for name in (
            "n",
            "logprobs",
            "top_logprobs",
            "presence_penalty",
            "frequency_penalty",
            "repetition_penalty",
            "min_p",
            "min_tokens",
            "max_tokens",
            "stop_token_ids",
            "parallel_tool_calls",
            "guided_json",
            "guided_regex",
            "guided_choice",
            "guided_grammar",
            "structured_outputs",
            "functions",
            "function_call",
            "best_of",
        )
    },
}


def body_bytes(fields: dict[str, Any], prompt: bool) -> bytes:
    base: dict[str, Any] = {"model": "demo"}
    base |= {"prompt": "x"} if prompt else {"messages": [{"role": "user", "content": "x"}]}
    return json.dumps(base | fields, allow_nan=True).encode()


def field_error(body: bytes, prompt: bool) -> OpenAIError | None:
    """The 400 a field drew, or None when the request built (or the body itself was bad:
    NaN or a lone surrogate, answered before any field is read)."""
    try:
        payload = translate.parse_body(body)
    except OpenAIError:
        return None
    try:
        if prompt:
            pb.CompleteRequest(**translate.completion_call(payload).fields)
        else:
            pb.ChatRequest(**translate.chat_call(payload).fields)
    except OpenAIError as err:
        return err
    return None


@FUZZ
@given(fields=st.fixed_dictionaries({}, optional=CHAT_FIELDS), prompt=st.booleans())
def test_hostile_values_are_400s_or_valid_requests(fields: dict[str, Any], prompt: bool) -> None:
    err = field_error(body_bytes(fields, prompt), prompt)
    if err is not None:
        assert (err.status, err.param is not None) == (400, True), err.body()
