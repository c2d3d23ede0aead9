"""AsyncEngine: the torch GenerationBackend — a step loop in its own thread, streams via asyncio."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from .api import (
    EngineError,
    EngineInfo,
    FinishReason,
    InvalidRequest,
    LoadSnapshot,
    Resume,
    SamplingOptions,
    TokenEvent,
)
from .config import EngineConfig
from .core import Emitted, EngineCore
from .grammar import CompiledFormat

log = logging.getLogger(__name__)

JOIN_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class _Add:
    request_id: str
    prompt: tuple[int, ...]
    sampling: SamplingOptions
    priority: int
    arrival: float
    grammar: CompiledFormat | None = None  # sampling.output_format, compiled
    resume: Resume | None = None


@dataclass(frozen=True, slots=True)
class _Abort:
    request_id: str


@dataclass(slots=True)
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[TokenEvent]
    aborted: bool = False  # abort() was called (read once its format has compiled)


class AsyncEngine:
    """Continuous-batching engine over EngineCore; implements GenerationBackend.

    The event loop thread only enqueues commands and reads events; the engine thread owns the
    core: it applies commands between steps (so an abort frees blocks before the next step),
    runs steps while there is work, and hands each step's events back with one
    call_soon_threadsafe per event loop.
    """

    def __init__(self, core: EngineCore) -> None:
        self._core = core
        self._info = core.info()
        self._snapshot = core.load()
        self._cond = threading.Condition()
        self._commands: list[_Add | _Abort] = []
        self._streams: dict[str, _Stream] = {}
        self._streams_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopping = False

    @classmethod
    def from_checkpoint(cls, path: Path, config: EngineConfig, model_name: str) -> AsyncEngine:
        """Load the checkpoint (blocking: seconds for large models) and build the engine."""
        return cls(EngineCore.from_checkpoint(path, config, model_name))

    @property
    def core(self) -> EngineCore:
        """The synchronous core (for tests and tools; only touch it while the engine is stopped)."""
        return self._core

    async def start(self) -> None:
        if self._thread is not None:
            return
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="inference-engine", daemon=True)
        self._thread.start()
        self._core.grammars.warm_up()  # in the background: the first format need not wait

    async def stop(self) -> None:
        thread = self._thread
        if thread is None:
            return
        with self._cond:
            self._stopping = True
            self._cond.notify()
        await asyncio.to_thread(thread.join, JOIN_TIMEOUT_S)
        self._thread = None

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: SamplingOptions,
        priority: int = 0,
        resume: Resume | None = None,
    ) -> AsyncIterator[TokenEvent]:
        """Stream one request's events; bad input raises InvalidRequest at the first iteration.

        Closing the iterator early (aclose, or the consuming task being cancelled) aborts the
        request and frees its KV blocks. An output format is compiled (on the grammar worker)
        before the request is queued, so other requests keep streaming meanwhile.
        """
        if self._thread is None or self._stopping:
            raise EngineError("engine is not running")
        self._core.validate(request_id, prompt_token_ids, sampling, resume)
        arrival = time.perf_counter()  # the compile wait counts as queueing
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue())
        with self._streams_lock:
            if request_id in self._streams:
                raise InvalidRequest(f"request_id {request_id!r} is already running")
            self._streams[request_id] = stream
        finished = False
        try:
            prompt = tuple(prompt_token_ids)
            grammar = await self._compile(sampling)
            if stream.aborted or self._stopping:  # while compiling
                finished = True
                reason = FinishReason.CANCELLED if stream.aborted else FinishReason.ERROR
                yield _final_event(len(prompt), reason)
                return
            self._post(_Add(request_id, prompt, sampling, priority, arrival, grammar, resume))
            while not finished:
                event = _coalesce(await stream.queue.get(), stream.queue)
                finished = event.finish_reason is not None
                yield event
        finally:
            if not finished:
                self._post(_Abort(request_id))
            with self._streams_lock:
                if self._streams.get(request_id) is stream:
                    del self._streams[request_id]

    def abort(self, request_id: str) -> None:
        with self._streams_lock:
            stream = self._streams.get(request_id)
        if stream is not None:
            stream.aborted = True
            self._post(_Abort(request_id))

    def load(self) -> LoadSnapshot:
        return self._snapshot

    def info(self) -> EngineInfo:
        return self._info

    async def _compile(self, sampling: SamplingOptions) -> CompiledFormat | None:
        if sampling.output_format is None:
            return None
        return await self._core.grammars.compile_async(sampling.output_format)

    def _post(self, command: _Add | _Abort) -> None:
        with self._cond:
            self._commands.append(command)
            self._cond.notify()

    def _run(self) -> None:
        with torch.inference_mode():
            while True:
                with self._cond:
                    while not (self._commands or self._core.has_work or self._stopping):
                        self._cond.wait()
                    if self._stopping:
                        break
                    commands, self._commands = self._commands, []
                events = self._apply(commands)
                if self._core.has_work:
                    events.extend(self._step())
                self._snapshot = self._core.load()
                self._dispatch(events)
        # Stopping: end every request, including those submitted but never admitted.
        with self._cond:
            pending, self._commands = self._commands, []
        events = self._core.abort_all(FinishReason.ERROR)
        events += [
            Emitted(c.request_id, _final_event(len(c.prompt)))
            for c in pending
            if isinstance(c, _Add)
        ]
        self._dispatch(events)
        self._snapshot = self._core.load()

    def _apply(self, commands: list[_Add | _Abort]) -> list[Emitted]:
        events: list[Emitted] = []
        for command in commands:
            if isinstance(command, _Abort):
                emitted = self._core.abort_request(command.request_id)
                if emitted is not None:
                    events.append(emitted)
                continue
            try:
                self._core.add_request(
                    command.request_id,
                    command.prompt,
                    command.sampling,
                    command.priority,
                    command.arrival,
                    command.grammar,
                    command.resume,
                )
            except InvalidRequest:
                # Validated before queueing; only a race on a reused id can land here.
                log.warning("request rejected by the engine", exc_info=True)
                events.append(Emitted(command.request_id, _final_event(len(command.prompt))))
        return events

    def _step(self) -> list[Emitted]:
        try:
            return self._core.step()
        except Exception:
            # A failed step leaves sequences half-computed: end them all, keep serving new ones.
            log.exception("engine step failed; failing all in-flight requests")
            return self._core.abort_all(FinishReason.ERROR)

    def _dispatch(self, events: list[Emitted]) -> None:
        if not events:
            return
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Stream, TokenEvent]]] = {}
        with self._streams_lock:
            for emitted in events:
                stream = self._streams.get(emitted.request_id)
                if stream is not None:
                    by_loop.setdefault(stream.loop, []).append((stream, emitted.event))
        for loop, items in by_loop.items():
            # A closed event loop raises RuntimeError: its consumers are gone.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_deliver, items)


def _deliver(items: list[tuple[_Stream, TokenEvent]]) -> None:
    for stream, event in items:
        stream.queue.put_nowait(event)


def _coalesce(first: TokenEvent, queue: asyncio.Queue[TokenEvent]) -> TokenEvent:
    """Merge events already waiting behind `first` (a slow consumer gets fewer, larger deltas)."""
    event = first
    while event.finish_reason is None and not queue.empty():
        event = event.then(queue.get_nowait())
    return event


def _final_event(prompt_tokens: int, reason: FinishReason = FinishReason.ERROR) -> TokenEvent:
    """The last event of a request that never produced a token."""
    return TokenEvent(
        token_ids=(),
        text_delta="",
        logprobs=None,
        finish_reason=reason,
        prompt_tokens=prompt_tokens,
        completion_tokens=0,
        cached_tokens=0,
        timings=None,
    )
