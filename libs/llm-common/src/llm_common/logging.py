"""structlog JSON logging with request, trace and service context; stdlib logging included."""

from __future__ import annotations

import logging
import math
import re
import sys
import time
from collections.abc import Callable, MutableMapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TextIO

import structlog
from opentelemetry import trace

request_id_var: ContextVar[str | None] = ContextVar("llm_request_id", default=None)

REDACTED = "[redacted]"
# Keys whose values are credentials or user content (prompts, completions): never logged.
SENSITIVE_KEYS = frozenset(
    {
        "authorization",
        "api_key",
        "apikey",
        "password",
        "passwd",
        "secret",
        "token",
        "access_token",
        "refresh_token",
        "id_token",
        "jwt",
        "cookie",
        "set-cookie",
        "x-api-key",
        "hmac_key",
        "prompt",
        "completion",
        "messages",
        "content",
    }
)
_SENSITIVE_SUFFIXES = ("_secret", "_password", "_api_key", "_token")
# Credentials that slip into free text (messages, tracebacks): bearer tokens, JWTs,
# `sk-…` style API keys and `password=…`-like assignments.
_SECRET_PATTERN = re.compile(
    r"(?i)\bbearer\s+[\w.~+/=-]+"
    r"|\beyJ[\w-]*\.[\w-]*\.[\w-]*"
    r"|\b(?:sk|llm)[-_][A-Za-z0-9_-]{16,}"
    r"|(?<![A-Za-z0-9])(?:password|passwd|secret|token|api[_-]?key)[\"']?\s*[=:]\s*[\"']?[^\s\"',;]+"
)

_Event = MutableMapping[str, Any]


def current_request_id() -> str | None:
    """The request id of the RPC being handled in this context, if any."""
    return request_id_var.get()


def is_sensitive_key(key: str) -> bool:
    """Whether a log field of this name must have its value redacted."""
    lowered = key.lower()
    return lowered in SENSITIVE_KEYS or lowered.endswith(_SENSITIVE_SUFFIXES)


# Every branch of _SECRET_PATTERN starts with one of these literals (searched case-folded, as
# the pattern matches case-insensitively). Most log values (ids, names, addresses) contain
# none, and looking for them is several times cheaper than running the pattern itself.
_SECRET_TRIGGER = re.compile(r"bearer|eyj|sk[-_]|llm[-_]|passw|secret|token|api")


def scrub_text(text: str) -> str:
    """`text` with anything shaped like a credential replaced."""
    if _SECRET_TRIGGER.search(text.casefold()) is None:
        return text
    return _SECRET_PATTERN.sub(REDACTED, text)


def _add_service(service_name: str) -> structlog.types.Processor:
    def add_service(_: Any, __: str, event: _Event) -> _Event:
        event.setdefault("service", service_name)
        return event

    return add_service


def _add_context(_: Any, __: str, event: _Event) -> _Event:
    request_id = request_id_var.get()
    if request_id is not None:
        event.setdefault("request_id", request_id)
    span_context = trace.get_current_span().get_span_context()
    if span_context.is_valid:
        event.setdefault("trace_id", format(span_context.trace_id, "032x"))
        event.setdefault("span_id", format(span_context.span_id, "016x"))
    return event


# Fields the pipeline itself fills in (names, levels, hex ids, times): never user data, so
# not scrubbed. `request_id` is not among them: a caller chooses it.
_PIPELINE_KEYS = frozenset({"timestamp", "level", "logger", "service", "trace_id", "span_id"})


def _redact(_: Any, __: str, event: _Event) -> _Event:
    for key, value in event.items():
        if key in _PIPELINE_KEYS:
            continue
        if is_sensitive_key(key):
            event[key] = REDACTED
        elif isinstance(value, str):
            event[key] = scrub_text(value)
    return event


def _shared_processors(service_name: str) -> list[structlog.types.Processor]:
    return [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True, key="timestamp"),
        _add_service(service_name),
        _add_context,
    ]


def _formatter(service_name: str) -> structlog.stdlib.ProcessorFormatter:
    # For stdlib loggers (libraries). Redaction runs last, after exception rendering, so
    # tracebacks are scrubbed too.
    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[
            structlog.stdlib.add_logger_name,
            *_shared_processors(service_name),
            structlog.stdlib.ExtraAdder(),
        ],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            _redact,
            structlog.processors.JSONRenderer(),
        ],
    )


_LEVELS = logging.getLevelNamesMapping()


def _drop_below_level(logger: _LineWriter, method: str, event: _Event) -> _Event:
    # The stdlib logger of the same name decides, so levels set through `logging` (per
    # logger, or on the root) apply to structlog's lines too.
    level = _LEVELS.get(method.upper(), logging.ERROR)  # `exception` logs at ERROR
    if not logging.getLogger(logger.name).isEnabledFor(level):
        raise structlog.DropEvent
    return event


def _add_logger_name(logger: _LineWriter, _: str, event: _Event) -> _Event:
    event["logger"] = logger.name
    return event


class _LineWriter:
    """Where structlog's rendered lines go: the stdlib handler's stream, under its lock.

    structlog's own loggers are rendered straight to JSON. Passing them through stdlib logging
    (a LogRecord, copied again by the formatter, and a caller lookup for each line) cost about
    three times as much, and every RPC writes an access line.
    """

    __slots__ = ("_handler", "name")

    def __init__(self, handler: logging.StreamHandler[TextIO], name: str) -> None:
        self._handler = handler
        self.name = name

    def msg(self, line: str) -> None:
        handler = self._handler
        handler.acquire()
        try:
            handler.stream.write(line + "\n")
            handler.stream.flush()
        except (OSError, ValueError):
            pass  # as with stdlib handlers: a closed or broken stream never fails the caller
        finally:
            handler.release()

    debug = info = warning = warn = error = exception = critical = fatal = log = msg


def configure_logging(
    service_name: str, level: str = "INFO", *, stream: TextIO | None = None
) -> None:
    """Send structlog and stdlib logging to `stream` (stderr) as one JSON object per line.

    Safe to call again (tests do); the root handler is replaced, not duplicated.
    """
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(_formatter(service_name))
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(level.upper())

    def writer(name: str = "root", *_: Any) -> _LineWriter:
        return _LineWriter(handler, name)

    structlog.configure(
        processors=[
            _drop_below_level,
            _add_logger_name,
            *_shared_processors(service_name),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            _redact,
            structlog.processors.JSONRenderer(),
        ],
        logger_factory=writer,
        wrapper_class=structlog.make_filtering_bound_logger(logging.NOTSET),
        cache_logger_on_first_use=False,
    )


def get_logger(name: str) -> structlog.typing.FilteringBoundLogger:
    """A structlog logger named `name`; the stdlib logger of that name sets its level."""
    logger: structlog.typing.FilteringBoundLogger = structlog.get_logger(name)
    return logger


@dataclass(slots=True)
class LogThrottle:
    """At most one line per `interval_s` for a condition that repeats with every request (a
    dependency down): the rest are counted, and the next line says how many were left out.
    The metrics count every occurrence; the log only has to say that it is happening."""

    interval_s: float = 10.0
    clock: Callable[[], float] = time.monotonic
    _next_at: float = field(default=-math.inf, init=False)
    _suppressed: int = field(default=0, init=False)

    def due(self) -> int | None:
        """None: stay quiet. Otherwise log now; the value is how many were left out since."""
        now = self.clock()
        if now < self._next_at:
            self._suppressed += 1
            return None
        self._next_at = now + self.interval_s
        suppressed, self._suppressed = self._suppressed, 0
        return suppressed
