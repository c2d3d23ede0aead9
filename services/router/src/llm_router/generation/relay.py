"""A started generation: relays the answer through the output guard, and when it ends (any
way: finished, filtered, failed, cancelled) settles, stores it in the cache and logs it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass, field

from llm_common.errors import Unavailable
from llm_common.logging import get_logger
from llm_common.tools import CallDelta
from llm_router.api.identity import Caller
from llm_router.background import Background
from llm_router.clients.cache import CacheClient
from llm_router.errors import ReplicaFailed
from llm_router.generation.sources import STOP, UNSET, FinishReason, Piece, Source
from llm_router.observability import RouterMetrics, access_log, digest, start_span
from llm_router.requests import GenerationRequest
from llm_router.safety.output_guard import GuardResult, StreamGuard
from llm_router.safety.policies import OutputPolicy
from llm_router.settlement.settle import Admission, Outcome, Settler
from llmapi.cache.v1 import cache_service_pb2 as cache_pb
from llmapi.common.v1 import common_pb2

_log = get_logger(__name__)
LENGTH = common_pb2.FINISH_REASON_LENGTH
CANCELLED = common_pb2.FINISH_REASON_CANCELLED
CONTENT_FILTER = common_pb2.FINISH_REASON_CONTENT_FILTER
ERROR = common_pb2.FINISH_REASON_ERROR


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """Facts about the request a Generation reports with."""

    request_id: str
    caller: Caller
    request: GenerationRequest
    model: str
    prompt_tokens: int
    sampling: common_pb2.SamplingParams
    stream: bool
    started: float  # perf_counter at arrival


@dataclass(frozen=True, slots=True)
class Chunk:
    """A piece of the answer for the client; the last one holds finish_reason and usage."""

    text: str = ""
    logprobs: tuple[common_pb2.TokenLogprob, ...] = ()
    finish_reason: FinishReason = UNSET
    usage: common_pb2.Usage | None = None
    tool_calls: tuple[CallDelta, ...] = ()  # filled by ToolCallReader (tool_output)


@dataclass(slots=True)
class _Tally:
    completion_tokens: int = 0
    token_ids: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)  # as delivered (after the guard)
    cached_tokens: int = 0
    first_token_at: float | None = None
    last_token_at: float | None = None
    first_chunk_at: float | None = None
    redacted: set[str] = field(default_factory=set)
    blocked_rule: str = ""


class Generation:
    """One admitted request with its answer source; iterate `chunks()` exactly once."""

    @dataclass(frozen=True, slots=True)
    class Deps:
        settler: Settler
        metrics: RouterMetrics
        background: Background
        cache: CacheClient | None
        cache_key: cache_pb.CacheKey | None

    def __init__(
        self,
        info: RequestInfo,
        source: Source,
        policy: OutputPolicy,
        admission: Admission,
        deps: Deps,
    ) -> None:
        self.info = info
        self._source = source
        self._policy = policy
        self._admission = admission
        self._deps = deps
        self._tally = _Tally()
        self._pending_logprobs: list[common_pb2.TokenLogprob] = []
        self._closed = False

    @property
    def request_id(self) -> str:
        return self.info.request_id

    @property
    def model(self) -> str:
        return self.info.model

    @property
    def cache_hit(self) -> str:
        return self._source.cache_hit

    @property
    def similarity(self) -> float:
        return self._source.similarity

    async def chunks(self) -> AsyncGenerator[Chunk, None]:
        """The guarded answer; the last chunk holds finish_reason and usage."""
        guard = StreamGuard(self._policy)
        span = start_span("generate", model=self.model, replica=self._source.replica)
        finish: FinishReason = UNSET
        final = False
        try:
            held = ""
            async with aclosing(self._source.pieces()) as pieces:
                async for piece in pieces:
                    self._count(piece)
                    released = self._take(guard.feed(piece.text))
                    if piece.finish_reason or self._tally.blocked_rule:
                        held, finish = released, piece.finish_reason
                        break
                    if released:
                        yield self._chunk(released)
            if self._tally.blocked_rule:
                # The last chunk's usage must be what is billed: the replica's own count.
                self._produced(await self._source.stop())
            else:
                held += self._take(guard.finish())
            finish = CONTENT_FILTER if self._tally.blocked_rule else (finish or STOP)
            final = True
            yield self._chunk(held, finish_reason=finish, last=True)
        except ReplicaFailed:
            finish, final = ERROR, True
            if not self.info.stream:
                raise Unavailable(
                    "the replica failed while generating", retry_after_s=1.0
                ) from None
            yield self._chunk("", finish_reason=ERROR, last=True)
        except (asyncio.CancelledError, GeneratorExit):
            if not final:  # closed after the last chunk went out is not a cancellation
                finish = CANCELLED
            raise
        except BaseException:
            finish = ERROR
            raise
        finally:
            span.set_attribute("finish_reason", common_pb2.FinishReason.Name(finish))
            span.end()
            self._close(finish)

    def abandon(self) -> None:
        """Settle as cancelled if `chunks()` never ran (the caller left before it started)."""
        self._close(CANCELLED)

    def _count(self, piece: Piece) -> None:
        tally = self._tally
        if piece.token_ids:
            now = time.perf_counter()
            tally.first_token_at = tally.first_token_at or now
            tally.last_token_at = now
        tally.completion_tokens += len(piece.token_ids)
        tally.token_ids.extend(piece.token_ids)
        if piece.cached_tokens is not None:
            tally.cached_tokens = piece.cached_tokens
        self._pending_logprobs.extend(piece.logprobs)

    def _take(self, result: GuardResult) -> str:
        tally = self._tally
        tally.redacted.update(result.redacted)
        if result.blocked and not tally.blocked_rule:
            tally.blocked_rule = result.rule or "blocked"
        if result.text:
            tally.text.append(result.text)
        return result.text

    def _chunk(
        self, text: str, *, finish_reason: FinishReason = UNSET, last: bool = False
    ) -> Chunk:
        logprobs = tuple(self._pending_logprobs)
        self._pending_logprobs.clear()
        if text and self._tally.first_chunk_at is None:
            self._tally.first_chunk_at = time.perf_counter()
        return Chunk(
            text=text,
            logprobs=logprobs,
            finish_reason=finish_reason,
            usage=self.usage() if last else None,
        )

    def usage(self) -> common_pb2.Usage:
        """Token accounting so far (a cache hit counts its whole prompt as cached)."""
        prompt = self.info.prompt_tokens
        cached = prompt if self.cache_hit != "miss" else min(self._tally.cached_tokens, prompt)
        completion = self._tally.completion_tokens
        return common_pb2.Usage(
            prompt_tokens=prompt,
            completion_tokens=completion,
            cached_tokens=cached,
            total_tokens=prompt + completion,
        )

    def _produced(self, total: int | None) -> None:
        if total is not None:
            self._tally.completion_tokens = max(total, self._tally.completion_tokens)

    def _close(self, finish: FinishReason) -> None:
        if self._closed:
            return
        self._closed = True
        if self._source.running:
            # Ended early (the caller left): settle once the replica said what it produced.
            self._deps.background.spawn(self._stop_then_settle(finish))
            return
        self._source.close()
        self._settle(finish)

    async def _stop_then_settle(self, finish: FinishReason) -> None:
        try:
            self._produced(await self._source.stop())
        finally:
            self._source.close()
            self._settle(finish)

    def _settle(self, finish: FinishReason) -> None:
        usage = self.usage()
        produced = usage.completion_tokens > 0 or self.cache_hit != "miss"
        outcome = Outcome(
            usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens, finish, produced
        )
        self._deps.settler.submit(self._admission, outcome)
        if finish in (STOP, LENGTH) and self.cache_hit == "miss":
            self._store(finish, usage)
        self._observe(finish, usage)

    def _store(self, finish: FinishReason, usage: common_pb2.Usage) -> None:
        cache, key = self._deps.cache, self._deps.cache_key
        if cache is None or key is None:
            return
        request = cache_pb.StoreRequest(
            key=key,
            response=cache_pb.CachedResponse(
                text="".join(self._tally.text),
                token_ids=self._tally.token_ids,
                finish_reason=finish,
                usage=usage,
            ),
            allow_nondeterministic=self.info.request.cache.store_nondeterministic,
        )
        timeout_s = 5.0

        async def store() -> None:
            try:
                await cache.store(request, timeout_s)
            except Exception as err:  # the cache is optional; a lost store is only a miss later
                _log.info("cache store failed", error=type(err).__name__)

        self._deps.background.spawn(store())

    def _observe(self, finish: FinishReason, usage: common_pb2.Usage) -> None:
        metrics, tally, info = self._deps.metrics, self._tally, self.info
        reason = common_pb2.FinishReason.Name(finish).removeprefix("FINISH_REASON_").lower()
        metrics.finished.labels(self.model, reason).inc()
        metrics.tokens.labels(self.model, "prompt").inc(usage.prompt_tokens)
        metrics.tokens.labels(self.model, "completion").inc(usage.completion_tokens)
        metrics.tokens.labels(self.model, "cached").inc(usage.cached_tokens)
        ttft_ms = None
        if tally.first_chunk_at is not None:
            metrics.ttft.labels(self.model).observe(tally.first_chunk_at - info.started)
            ttft_ms = round((tally.first_chunk_at - info.started) * 1e3, 3)
        if tally.first_token_at and tally.last_token_at and usage.completion_tokens > 1:
            tpot = (tally.last_token_at - tally.first_token_at) / (usage.completion_tokens - 1)
            metrics.tpot.labels(self.model).observe(tpot)
        for kind in tally.redacted:
            metrics.guard.labels("output", f"redacted_{kind}").inc()
        if tally.blocked_rule:
            metrics.guard.labels("output", "blocked").inc()
        access_log(
            request_id=info.request_id,
            billing_id=self._admission.billing_id,
            tenant=info.caller.tenant_id,
            key_id=info.caller.key_id,
            user=digest(info.request.user),
            model=self.model,
            kind=info.request.kind.value,
            stream=info.stream,
            replica=self._source.replica,
            route_reason=self._source.route_reason,
            cache=self.cache_hit,
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            cached_tokens=usage.cached_tokens,
            finish_reason=reason,
            guard_rule=tally.blocked_rule or None,
            ttft_ms=ttft_ms,
            duration_ms=round((time.perf_counter() - info.started) * 1e3, 3),
            billing_reserved=self._admission.billing_reserved,
        )
