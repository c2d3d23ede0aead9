"""InferenceServicer: validate, drive the backend or encoder, build responses."""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc

from llm_common.errors import (
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    PreconditionViolation,
    Unavailable,
)
from llm_common.logging import get_logger
from llm_inference import convert, validation
from llm_inference.config import Limits
from llm_inference.delivery import Grouped
from llm_inference.deployment import ModelFacts
from llm_inference.drain import Drain
from llm_inference.embedding.runtime import EmbeddingRuntime
from llm_inference.engine.api import (
    EngineError,
    EngineInfo,
    GenerationBackend,
    InvalidRequest,
    LoadSnapshot,
    TokenEvent,
)
from llm_inference.metrics import InferenceMetrics
from llm_inference.phases import record_phases
from llm_inference.token_bytes import TokenBytes
from llmapi.common.v1 import common_pb2
from llmapi.inference.v1 import inference_service_pb2 as pb
from llmapi.inference.v1 import inference_service_pb2_grpc as pb_grpc

Context = grpc.aio.ServicerContext[Any, Any]
ENGINE_RETRY_AFTER_S = 1.0
DRAINING_RETRY_AFTER_S = 0.5
_log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Generation:
    """A generation deployment: its backend and what requests are validated against."""

    backend: GenerationBackend
    facts: ModelFacts
    token_bytes: TokenBytes | None = None  # logprobs' token text and raw bytes


class InferenceServicer(pb_grpc.InferenceServiceServicer):
    """llmapi.inference.v1.InferenceService for one model: generation or embedding."""

    def __init__(
        self,
        model: str,
        runtime: Generation | EmbeddingRuntime,
        *,
        limits: Limits,
        metrics: InferenceMetrics,
        replica_id: str,
        weights_digest: str = "",
    ) -> None:
        self._model = model
        self._runtime = runtime
        self._limits = limits
        self._metrics = metrics
        self._replica_id = replica_id
        self._weights_digest = weights_digest
        self._sequence = itertools.count()
        self._running: dict[str, set[str]] = {}  # caller's request_id -> engine ids
        self._drain = Drain()

    # Method names are the contract's RPC names, hence the noqa N802.
    async def Generate(  # noqa: N802
        self, request: pb.GenerateRequest, context: Context
    ) -> AsyncIterator[pb.GenerateResponse]:
        generation = self._generation()
        if self._drain.draining:
            raise Unavailable("this replica is shutting down", DRAINING_RETRY_AFTER_S)
        given = validation.generate_input(request, generation.facts, self._limits)
        # Callers' ids need not be unique; the engine's must be.
        engine_id = f"{given.request_id[:96]}#{next(self._sequence)}"
        arrival_ns = time.time_ns()
        try:
            events = generation.backend.generate(
                engine_id, given.prompt_token_ids, given.sampling, given.priority, given.resume
            )
        except EngineError as exc:
            raise _service_error(given.request_id, exc) from exc
        last: TokenEvent | None = None
        failed = False
        self._running.setdefault(given.request_id, set()).add(engine_id)
        messages = Grouped(events, given.delivery)
        try:
            async for event in messages:
                last = event
                response = convert.generate_response(
                    event, detokenize=given.detokenize, tokens=generation.token_bytes
                )
                if event.finish_reason is not None and engine_id in self._drain.handed_back:
                    # Ended by the drain, not by its caller: ERROR tells the router to resume
                    # it on another replica.
                    response.finish_reason = common_pb2.FINISH_REASON_ERROR
                yield response
                if event.finish_reason is not None:
                    self._finished(given.request_id, event)
                    record_phases(arrival_ns, event)
                    return
        except EngineError as exc:
            failed = True
            raise _service_error(given.request_id, exc) from exc
        finally:
            self._forget(given.request_id, engine_id)
            if last is None or last.finish_reason is None:
                # Client cancel, deadline or failure: free the KV blocks now, not at GC.
                generation.backend.abort(engine_id)
                if not failed:
                    self._metrics.abandoned(messages.generated)
            await messages.aclose()
            await _aclose(events)  # closing the engine's stream aborts the request too

    async def Stop(  # noqa: N802
        self, request: pb.StopRequest, context: Context
    ) -> pb.StopResponse:
        request_id = validation.stop_request_id(request)
        generation = self._generation()
        engine_ids = tuple(self._running.get(request_id, ()))
        for engine_id in engine_ids:
            # The stream ends with a CANCELLED event that carries what it held and the count.
            generation.backend.abort(engine_id)
        if engine_ids:
            _log.info("stop", request_id=request_id, streams=len(engine_ids))
        return pb.StopResponse(stopped=len(engine_ids))

    async def Embed(  # noqa: N802
        self, request: pb.EmbedRequest, context: Context
    ) -> pb.EmbedResponse:
        runtime = self._runtime
        if not isinstance(runtime, EmbeddingRuntime):
            raise self._wrong_kind("Embed", "embedding")
        texts = validation.embed_inputs(request, self._limits)
        result = await runtime.embed(texts, normalize=request.normalize)
        self._metrics.embedded(len(texts), result.prompt_tokens)
        response = pb.EmbedResponse(
            prompt_tokens=result.prompt_tokens, dimensions=result.dimensions
        )
        for vector in result.vectors:
            response.embeddings.add().values.extend(vector)
        return response

    async def Info(  # noqa: N802
        self, request: pb.InfoRequest, context: Context
    ) -> pb.InfoResponse:
        runtime = self._runtime
        if isinstance(runtime, EmbeddingRuntime):
            info = runtime.info()
            kind, max_context = common_pb2.MODEL_KIND_EMBEDDING, info.max_context
        else:
            info = runtime.backend.info()
            kind, max_context = common_pb2.MODEL_KIND_GENERATION, runtime.facts.max_context
        response = convert.info_response(
            info, kind=kind, replica_id=self._replica_id, max_context=max_context
        )
        response.weights_digest = self._weights_digest
        return response

    async def GetLoad(  # noqa: N802
        self, request: pb.GetLoadRequest, context: Context
    ) -> pb.GetLoadResponse:
        return pb.GetLoadResponse(load=self._load_report())

    async def WatchLoad(  # noqa: N802
        self, request: pb.WatchLoadRequest, context: Context
    ) -> AsyncIterator[pb.WatchLoadResponse]:
        interval_s = validation.watch_interval_s(request)
        while True:
            yield pb.WatchLoadResponse(load=self._load_report())
            if self._drain.done:  # the last report said draining; the server may now stop
                return
            await self._drain.pause(interval_s)  # a drain starting is reported at once

    async def drain(self, grace_s: float) -> None:
        """Shutdown: refuse new generations, let running ones finish within `grace_s`, hand
        back the rest (see Drain), then end the load streams."""
        _log.info("draining", grace_s=grace_s, running=len(self._engine_ids()))
        runtime = self._runtime
        hand_back = runtime.backend.abort if isinstance(runtime, Generation) else _nothing
        await self._drain.run(grace_s, self._engine_ids, hand_back)
        _log.info("drained", handed_back=len(self._drain.handed_back))

    def _engine_ids(self) -> list[str]:
        return [engine_id for ids in self._running.values() for engine_id in ids]

    def _load_report(self) -> pb.LoadReport:
        return convert.load_report(self.load(), self._replica_id, draining=self._drain.draining)

    def load(self) -> LoadSnapshot:
        """The current load of whichever runtime this deployment has."""
        runtime = self._runtime
        return runtime.load() if isinstance(runtime, EmbeddingRuntime) else runtime.backend.load()

    def info(self) -> EngineInfo:
        runtime = self._runtime
        return runtime.info() if isinstance(runtime, EmbeddingRuntime) else runtime.backend.info()

    def _generation(self) -> Generation:
        if isinstance(self._runtime, EmbeddingRuntime):
            raise self._wrong_kind("Generate", "generation")
        return self._runtime

    def _wrong_kind(self, rpc: str, needed: str) -> FailedPrecondition:
        served = "generation" if needed == "embedding" else "embedding"
        return FailedPrecondition(
            f"{rpc} needs a {needed} deployment; this replica serves {served} model {self._model}",
            [PreconditionViolation("MODEL_KIND", self._model, f"model kind is {served}")],
        )

    def _forget(self, request_id: str, engine_id: str) -> None:
        engine_ids = self._running.get(request_id)
        if engine_ids is not None:
            engine_ids.discard(engine_id)
            if not engine_ids:
                del self._running[request_id]
        self._drain.notify()

    def _finished(self, request_id: str, event: TokenEvent) -> None:
        self._metrics.finished(event)
        reason = event.finish_reason.value if event.finish_reason is not None else None
        _log.info(
            "generated",
            request_id=request_id,
            finish_reason=reason,
            prompt_tokens=event.prompt_tokens,
            completion_tokens=event.completion_tokens,
            cached_tokens=event.cached_tokens,
            ttft_ms=None if event.timings is None else round(event.timings.ttft_ms, 2),
        )


def _nothing(engine_id: str) -> None:
    """Embedding deployments have no generations to hand back."""


def _service_error(request_id: str, exc: EngineError) -> InvalidArgument | Unavailable:
    if isinstance(exc, InvalidRequest):
        return InvalidArgument([FieldViolation(exc.field or "prompt_token_ids", str(exc))])
    _log.warning("engine error", request_id=request_id, error=str(exc))
    return Unavailable("the engine failed this request", ENGINE_RETRY_AFTER_S)


async def _aclose(events: AsyncIterator[TokenEvent]) -> None:
    close = getattr(events, "aclose", None)
    if close is not None:
        await close()
