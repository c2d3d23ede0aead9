"""JSON logs carry service, level, timestamp, request and trace ids, and never credentials."""

from __future__ import annotations

import io
import logging

from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import TracerProvider

from llm_common.logging import (
    _SECRET_PATTERN,
    REDACTED,
    LogThrottle,
    configure_logging,
    get_logger,
    request_id_var,
    scrub_text,
)
from llm_testing import LogCapture, captured_logs


def test_structlog_line_has_context(json_logs: LogCapture) -> None:
    token = request_id_var.set("req-1")
    try:
        with TracerProvider().get_tracer("t").start_as_current_span("work") as span:
            get_logger("svc").info("routed", model="demo", prompt_tokens=12)
    finally:
        request_id_var.reset(token)
    (line,) = json_logs.records()
    assert line["event"] == "routed"
    assert line["level"] == "info"
    assert line["service"] == "test"
    assert line["logger"] == "svc"
    assert line["timestamp"].endswith("Z")
    assert line["request_id"] == "req-1"
    assert line["trace_id"] == format(span.get_span_context().trace_id, "032x")
    assert line["span_id"] == format(span.get_span_context().span_id, "016x")
    assert (line["model"], line["prompt_tokens"]) == ("demo", 12)


def test_stdlib_logging_uses_the_same_renderer(json_logs: LogCapture) -> None:
    logging.getLogger("plain").warning("cache miss", extra={"tenant": "acme"})
    (line,) = json_logs.records()
    assert (line["event"], line["level"], line["tenant"]) == ("cache miss", "warning", "acme")
    assert line["service"] == "test"
    assert "request_id" not in line  # no RPC in progress
    assert "trace_id" not in line


def test_credentials_and_prompts_are_never_logged(json_logs: LogCapture) -> None:
    log = get_logger("auth")
    log.info(
        "checked",
        authorization="Bearer s3cr3t-bearer",
        api_key="sk-live-0123456789abcdef",
        client_secret="hush",
        prompt="tell me a secret story",
    )
    log.info("header was Authorization: Bearer s3cr3t-bearer and password=hunter2")
    logging.getLogger("std").info("key sk-live-0123456789abcdef seen")
    try:
        raise ValueError("token=abc.def.ghi rejected")
    except ValueError:
        log.exception("verify failed")
    text = json_logs.text
    for secret in ("s3cr3t-bearer", "sk-live-0123456789abcdef", "hush", "secret story", "hunter2"):
        assert secret not in text
    assert "abc.def.ghi" not in text
    first = json_logs.records()[0]
    assert first["authorization"] == first["prompt"] == "[redacted]"
    assert len(json_logs.records()) == 4


def test_level_filters(json_logs: LogCapture) -> None:
    logging.getLogger().setLevel(logging.WARNING)
    get_logger("x").info("hidden")
    get_logger("x").warning("shown")
    assert [line["event"] for line in json_logs.records()] == ["shown"]


def test_a_loggers_own_stdlib_level_applies(json_logs: LogCapture) -> None:
    quiet = logging.getLogger("chatty")
    quiet.setLevel(logging.ERROR)
    try:
        get_logger("chatty").warning("dropped")
        get_logger("chatty").error("kept")
        get_logger("other").debug("also kept")  # the capture's root level is DEBUG
    finally:
        quiet.setLevel(logging.NOTSET)
    assert [line["event"] for line in json_logs.records()] == ["kept", "also kept"]


def test_exceptions_log_at_error_with_a_traceback(json_logs: LogCapture) -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        get_logger("svc").exception("failed")
    (line,) = json_logs.records()
    assert line["level"] == "error"
    assert "RuntimeError: boom" in line["exception"]


def test_a_closed_stream_never_fails_the_caller() -> None:
    stream = io.StringIO()
    with captured_logs() as capture:
        configure_logging("test", stream=stream)
        stream.close()
        get_logger("svc").info("lost")  # must not raise
        get_logger("svc").info("still fine")
    assert capture.text == ""


@settings(max_examples=400, deadline=None, derandomize=True)
@given(
    st.lists(
        st.sampled_from(
            [
                "Bearer ",
                "bEaReR\t",
                "eyJ",
                "EYJ",
                "sk-",
                "SK_",
                "llm-",
                "ſk-",  # long s: the pattern's case-insensitive match takes it for s
                "password=",
                "PASSWD: ",
                "secret=",
                "api_key=",
                "Api-Key:",
                "token: ",
                "abcdefghijklmnopqrstuvwxyz0123456789",
                ".",
                "-",
                " ",
                "\u212a",  # the Kelvin sign folds to k
            ]
        )
        | st.text(max_size=12),
        max_size=8,
    ).map("".join)
)
def test_prefilter_never_changes_what_is_scrubbed(text: str) -> None:
    assert scrub_text(text) == _SECRET_PATTERN.sub(REDACTED, text)


def test_a_throttled_condition_logs_once_per_interval_and_counts_the_rest() -> None:
    now = [100.0]
    throttle = LogThrottle(interval_s=10.0, clock=lambda: now[0])
    assert throttle.due() == 0  # the first occurrence is logged at once
    assert [throttle.due() for _ in range(5)] == [None] * 5
    now[0] += 9.9
    assert throttle.due() is None
    now[0] += 0.2
    assert throttle.due() == 6  # logged again, saying how many were left out
    assert throttle.due() is None
