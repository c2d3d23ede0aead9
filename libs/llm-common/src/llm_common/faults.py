"""Fault injection for chaos tests: delay or fail chosen RPCs, enabled only by `LLM_FAULTS`.

`LLM_FAULTS` holds `;`-separated rules `<method glob>:<key>=<value>,...`, for example
`/llmapi.cache.v1.*:error_rate=0.5,code=UNAVAILABLE,stop_s=20;*/Tokenize:delay_ms=300`.
Keys: `delay_ms` (0..60000, slept before the handler runs), `error_rate` (0..1, the fraction
of matching calls answered with `code` instead of running the handler), `code` (a gRPC status
name other than OK; default UNAVAILABLE), `start_s` / `stop_s` (the window, in seconds after
the server starts, in which the rule applies; default always). The first matching rule wins.
`LLM_FAULTS_SEED` (an integer) makes the injected failures reproducible.
Health and reflection are never faulted, so supervisors and probes keep telling the truth.
"""

from __future__ import annotations

import asyncio
import fnmatch
import inspect
import math
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health
from grpc_reflection.v1alpha import reflection

from llm_common.config import ConfigError
from llm_common.interceptors import wrap_handler

FAULTS_ENV = "LLM_FAULTS"
SEED_ENV = "LLM_FAULTS_SEED"
INJECTED_MESSAGE = "injected fault"
MAX_DELAY_MS = 60_000
MAX_RULES = 32
MAX_SPEC_CHARS = 4096
_EXEMPT_PREFIXES = (f"/{health.SERVICE_NAME}/", f"/{reflection.SERVICE_NAME}/")
_KEYS = frozenset({"delay_ms", "error_rate", "code", "start_s", "stop_s"})

Context = grpc.aio.ServicerContext[Any, Any]
Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class FaultRule:
    """What to do to the calls whose full method name matches `method_glob`."""

    method_glob: str
    delay_ms: int = 0
    error_rate: float = 0.0
    code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE
    start_s: float = 0.0
    stop_s: float = math.inf

    def matches(self, method: str) -> bool:
        return fnmatch.fnmatchcase(method, self.method_glob)

    def active(self, elapsed_s: float) -> bool:
        return self.start_s <= elapsed_s < self.stop_s


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """The parsed `LLM_FAULTS` rules and optional seed; empty means no interceptor at all."""

    rules: tuple[FaultRule, ...] = ()
    seed: int | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> FaultPlan:
        """The plan in `environ`; ConfigError naming the variable for anything malformed."""
        spec = environ.get(FAULTS_ENV, "").strip()
        seed_text = environ.get(SEED_ENV, "").strip()
        seed = _parse_seed(seed_text) if seed_text else None
        return cls(rules=parse_rules(spec), seed=seed)

    def rule_for(self, method: str) -> FaultRule | None:
        """The first rule for `method`; health and reflection never get one."""
        if method.startswith(_EXEMPT_PREFIXES):
            return None
        return next((rule for rule in self.rules if rule.matches(method)), None)


def _fail(problem: str) -> ConfigError:
    return ConfigError.for_variable(FAULTS_ENV, problem)


def _parse_seed(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ConfigError.for_variable(SEED_ENV, f"must be an integer, got {text!r}") from None


def parse_rules(spec: str) -> tuple[FaultRule, ...]:
    """Rules from the `LLM_FAULTS` syntax; an empty spec gives none."""
    if len(spec) > MAX_SPEC_CHARS:
        raise _fail(f"longer than {MAX_SPEC_CHARS} characters")
    parts = [part.strip() for part in spec.split(";") if part.strip()]
    if len(parts) > MAX_RULES:
        raise _fail(f"more than {MAX_RULES} rules")
    return tuple(_parse_rule(part) for part in parts)


def _parse_rule(text: str) -> FaultRule:
    glob, sep, options = text.partition(":")
    glob = glob.strip()
    if not sep or not glob or not options.strip():
        raise _fail(f"rule {text!r} is not '<method glob>:<key>=<value>,...'")
    values: dict[str, str] = {}
    for item in options.split(","):
        key, eq, value = (piece.strip() for piece in item.partition("="))
        if not eq or not key or not value:
            raise _fail(f"option {item.strip()!r} in rule {glob!r} is not '<key>=<value>'")
        if key not in _KEYS:
            raise _fail(f"unknown option {key!r} in rule {glob!r}; known: {sorted(_KEYS)}")
        if key in values:
            raise _fail(f"option {key!r} repeated in rule {glob!r}")
        values[key] = value
    return _build_rule(glob, values)


def _build_rule(glob: str, values: Mapping[str, str]) -> FaultRule:
    delay_ms = int(_number(glob, "delay_ms", values.get("delay_ms", "0"), 0, MAX_DELAY_MS))
    error_rate = _number(glob, "error_rate", values.get("error_rate", "0"), 0.0, 1.0)
    start_s = _number(glob, "start_s", values.get("start_s", "0"), 0.0, math.inf)
    stop_s = _number(glob, "stop_s", values.get("stop_s", "inf"), 0.0, math.inf)
    if stop_s <= start_s:
        raise _fail(f"rule {glob!r}: stop_s must be greater than start_s")
    if delay_ms == 0 and error_rate == 0.0:
        raise _fail(f"rule {glob!r} injects nothing; set delay_ms or error_rate")
    code = _status_code(glob, values.get("code", "UNAVAILABLE"))
    return FaultRule(glob, delay_ms, error_rate, code, start_s, stop_s)


def _number(glob: str, key: str, text: str, low: float, high: float) -> float:
    try:
        value = float(text)
    except ValueError:
        raise _fail(f"rule {glob!r}: {key} must be a number, got {text!r}") from None
    if key == "delay_ms" and not value.is_integer():
        raise _fail(f"rule {glob!r}: delay_ms must be a whole number, got {text!r}")
    if math.isnan(value) or not low <= value <= high:
        raise _fail(f"rule {glob!r}: {key} must be in [{low}, {high}], got {text!r}")
    return value


def _status_code(glob: str, name: str) -> grpc.StatusCode:
    code = grpc.StatusCode.__members__.get(name.upper())
    if code is None or code is grpc.StatusCode.OK:
        raise _fail(f"rule {glob!r}: code must be a gRPC status name other than OK, got {name!r}")
    return code


class FaultInterceptor(grpc.aio.ServerInterceptor):
    """Delays and fails matching calls before their handler runs, as the plan says.

    Install it innermost (ServiceSpec.interceptors) so the injected status is logged and
    counted by the ordinary access log and metrics like any real failure.
    """

    def __init__(
        self,
        plan: FaultPlan,
        *,
        rng: random.Random | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        self._plan = plan
        self._rng = rng if rng is not None else random.Random(plan.seed)
        self._clock = clock
        self._started = clock()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(handler_call_details)
        rule = self._plan.rule_for(handler_call_details.method)
        if handler is None or rule is None:
            return handler
        return wrap_handler(handler, lambda behavior: self._wrap(behavior, rule))

    async def _inject(self, rule: FaultRule, context: Context) -> None:
        if not rule.active(self._clock() - self._started):
            return
        if rule.delay_ms:
            await asyncio.sleep(rule.delay_ms / 1000)
        if rule.error_rate and self._rng.random() < rule.error_rate:
            await context.abort(rule.code, INJECTED_MESSAGE)

    def _wrap(self, behavior: Any, rule: FaultRule) -> Any:
        inject = self._inject
        if inspect.isasyncgenfunction(behavior):

            async def stream(request: Any, context: Context) -> AsyncIterator[Any]:
                await inject(rule, context)
                async with aclosing(behavior(request, context)) as responses:
                    async for response in responses:
                        yield response

            return stream
        if inspect.iscoroutinefunction(behavior):

            async def call(request: Any, context: Context) -> Any:
                await inject(rule, context)
                return await behavior(request, context)

            return call
        return behavior  # sync handlers run on grpc's thread pool; the platform has none


def fault_interceptors(
    environ: Mapping[str, str], *, rng: random.Random | None = None
) -> list[grpc.aio.ServerInterceptor]:
    """`[FaultInterceptor]` when `LLM_FAULTS` is set, else `[]` (the default: no overhead)."""
    plan = FaultPlan.from_env(environ)
    if not plan.rules:
        return []
    return [FaultInterceptor(plan, rng=rng)]
