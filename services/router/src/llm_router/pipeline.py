"""The generation pipeline: guard → tokenize → admit → cache → route → stream → settle."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass

from llm_common.errors import FieldViolation, InvalidArgument, ServiceError, Unavailable
from llm_common.logging import get_logger
from llm_common.models_config import Deployment, ModelSpec
from llm_common.tools import forced_format
from llm_router.admission.admit import NOTHING, Admitter, billing_id
from llm_router.api.identity import SCOPE_COMPLETION, Caller
from llm_router.api.validation import check_max_tokens, fits_context
from llm_router.background import Background
from llm_router.cache.lookup import CacheLookup
from llm_router.cache.near_feed import NearCacheParts
from llm_router.clients.cache import CacheClient
from llm_router.generation.relay import Generation, RequestInfo
from llm_router.generation.sources import CachedSource, LiveSource
from llm_router.observability import RouterMetrics, phase
from llm_router.requests import GenerationRequest, Kind
from llm_router.routing.dispatch import Dispatcher, Started
from llm_router.routing.models import AUTO_MODEL, GENERATION, ModelRouter
from llm_router.safety import input_guard
from llm_router.safety.policies import PolicyBook, TenantPolicy
from llm_router.settlement.settle import Admission, Settler
from llm_router.tokens.prompt import (
    PromptTokenizer,
    PromptTokens,
    UnconfirmedTokensError,
    admitted_ids,
)
from llmapi.cache.v1 import cache_service_pb2 as cache_pb
from llmapi.common.v1 import common_pb2

_log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Prepared:
    """A request bound to a model: its exact prompt tokens and effective sampling."""

    spec: ModelSpec
    tokens: PromptTokens  # checked once, at admission (tokens.prompt.admitted_ids)
    sampling: common_pb2.SamplingParams  # max_tokens always set
    deployments: list[Deployment]
    request: GenerationRequest  # after the input guard

    @property
    def prompt(self) -> list[int]:
        return self.tokens.ids


@dataclass(frozen=True, slots=True)
class CallInfo:
    """How the request was made: what a Generation reports besides the request itself."""

    request_id: str
    stream: bool
    started: float  # perf_counter at arrival


class Pipeline:
    """Turns a validated GenerationRequest into a started Generation.

    Everything that can fail before the first token fails here, as a clean status, and
    releases whatever was reserved; the Generation then owns settlement.
    """

    def __init__(
        self,
        *,
        router: ModelRouter,
        policies: PolicyBook,
        tokenizer: PromptTokenizer,
        admitter: Admitter,
        cache: CacheClient | None,
        dispatcher: Dispatcher,
        settler: Settler,
        background: Background,
        metrics: RouterMetrics,
        overlap_admission: bool = True,
        lookup_grace_s: float = 0.05,
        speculate_below_hit_rate: float = 0.0,
        near: NearCacheParts | None = None,
    ) -> None:
        self._overlap = overlap_admission
        self._lookup_grace_s = lookup_grace_s
        self._lookups = CacheLookup(cache, metrics, near, speculate_below_hit_rate)
        self._speculation = self._lookups.speculation
        self._router = router
        self._policies = policies
        self._tokenizer = tokenizer
        self._admitter = admitter
        self._cache = cache
        self._dispatcher = dispatcher
        self._settler = settler
        self._background = background
        self._metrics = metrics

    async def open(
        self, request: GenerationRequest, caller: Caller, *, request_id: str, stream: bool
    ) -> Generation:
        """Admit and start `request`: returns once the answer's first piece is in hand."""
        call = CallInfo(request_id, stream, started=time.perf_counter())
        caller.require_scope(SCOPE_COMPLETION)
        policy = self._policies.for_tenant(caller.tenant_id)
        request = self._screen(request, policy)
        prepared = await self._prepare(request, caller, policy)
        # Callers refused recently are admitted before anything starts (sequential), so a
        # client hammering past its limit cannot make replicas prefill for nothing.
        overlap = self._overlap and not self._admitter.refusals.recent(caller)
        try:
            return await self._start(prepared, caller, policy, overlap, call)
        except UnconfirmedTokensError as unconfirmed:
            # Rare (a tokenizer deployed apart from the router's copy): nothing was admitted
            # or sent; the replica's work on the router's ids was cancelled.
            prepared = self._rebind(prepared, unconfirmed.ids, caller)
            return await self._start(prepared, caller, policy, overlap, call)

    async def _start(
        self,
        prepared: Prepared,
        caller: Caller,
        policy: TenantPolicy,
        overlap: bool,
        call: CallInfo,
    ) -> Generation:
        info = RequestInfo(
            request_id=call.request_id,
            caller=caller,
            request=prepared.request,
            model=prepared.spec.name,
            prompt_tokens=len(prepared.prompt),
            sampling=prepared.sampling,
            stream=call.stream,
            started=call.started,
        )
        key = self._lookups.key(
            prepared.request, caller, prepared.spec.name, prepared.prompt, prepared.sampling
        )
        return await self._open(prepared, policy, info, key, overlap)

    async def _open(
        self,
        prepared: Prepared,
        policy: TenantPolicy,
        info: RequestInfo,
        key: cache_pb.CacheKey | None,
        overlap: bool,
    ) -> Generation:
        # The one request path. Overlapped, admission runs alongside the cache lookup and the
        # replica's prefill. Nothing reaches the caller before admission succeeded; a refusal
        # cancels the generation, which frees its KV blocks at once. While hits are common,
        # generation waits for the lookup, so a hit costs no replica work, but only for
        # `lookup_grace_s`: a slow cache must not delay every miss (the grace follows lookup
        # latency: see cache.speculation). While they are rare it starts first, and a hit
        # cancels it. Sequential is the special case where admission has succeeded before the
        # lookup starts, and generation waits for the lookup's miss.
        admit: asyncio.Future[Admission] | None = None
        if not overlap:
            admit = asyncio.get_running_loop().create_future()
            admit.set_result(await self._admit(prepared, info.caller, policy))
        dispatch: asyncio.Future[Started] | None = None
        if overlap and (key is None or self._speculation.dispatch_early()):
            dispatch = asyncio.ensure_future(self._dispatch(prepared, info.stream))
            # One turn of the loop for the dispatch to put its Generate on the wire before
            # admission's own Python runs: the prefill is the long pole, not the reservations.
            await asyncio.sleep(0)
        if admit is None:
            admit = asyncio.ensure_future(self._admit(prepared, info.caller, policy))
        lookup = asyncio.ensure_future(self._lookups.lookup(prepared.request, key))
        try:
            if dispatch is None:
                grace_s = self._speculation.grace_s(self._lookup_grace_s) if overlap else None
                await asyncio.wait({lookup}, timeout=grace_s)
                if not lookup.done():
                    dispatch = asyncio.ensure_future(self._dispatch(prepared, info.stream))
            hit = await lookup
            if hit is None and dispatch is None:
                dispatch = asyncio.ensure_future(self._dispatch(prepared, info.stream))
            admission = await admit
        except BaseException as error:
            admit.cancel()  # the admitter gives back whatever it still gets granted
            lookup.cancel()
            self._abandon(dispatch, _abandon_reason(error))
            self._release_granted(admit)
            raise
        try:
            if hit is not None:
                self._abandon(dispatch, "cache_hit")
                return self._generation(info, CachedSource(hit), policy, admission, key)
            assert dispatch is not None
            live = LiveSource(await dispatch, self._dispatcher, self._background)
            return self._generation(info, live, policy, admission, key)
        except BaseException:
            self._abandon(dispatch, "failed")
            self._settler.submit(admission, NOTHING)
            raise

    def _release_granted(self, admit: asyncio.Future[Admission]) -> None:
        # An admission granted before the request failed (the caller left during the lookup)
        # is given back; one still pending is given back by the admitter when cancelled.
        if admit.done() and not admit.cancelled() and admit.exception() is None:
            self._settler.submit(admit.result(), NOTHING)

    def _abandon(self, dispatch: asyncio.Future[Started] | None, reason: str) -> None:
        if dispatch is None:
            return
        self._metrics.abandoned.labels(reason).inc()
        dispatch.cancel()
        dispatch.add_done_callback(self._stop_started)

    def _stop_started(self, dispatch: asyncio.Future[Started]) -> None:
        # The cancel came after the stream had started (or it failed): stop it and free
        # its replica; reading the exception keeps asyncio from reporting it as lost.
        if dispatch.cancelled() or dispatch.exception() is not None:
            return
        started = dispatch.result()
        started.call.cancel()
        self._dispatcher.finish(started.placed.ticket)

    def _screen(self, request: GenerationRequest, policy: TenantPolicy) -> GenerationRequest:
        screened = input_guard.screen(request.texts, policy.input, request.text_field)
        for kind in screened.redacted:
            self._metrics.guard.labels("input", f"redacted_{kind}").inc()
        if screened.texts == request.texts:
            return request
        if request.kind is Kind.CHAT:
            messages = tuple(
                _with_content(m, text)
                for m, text in zip(request.messages, screened.texts, strict=True)
            )
            return dataclasses.replace(request, messages=messages)
        return dataclasses.replace(request, prompt=screened.texts[0])

    async def _prepare(
        self, request: GenerationRequest, caller: Caller, policy: TenantPolicy
    ) -> Prepared:
        allowed = policy.admission.allowed_tiers
        with phase(self._metrics, "tokenize"):
            if request.model == AUTO_MODEL:
                return await self._prepare_auto(request, caller, allowed)
            spec = self._router.resolve(request.model, GENERATION)
            caller.require_model(spec, allowed)
            tokens = await self._tokenizer.prompt_tokens(
                spec.name, request, tenant=caller.tenant_id, speculate=True
            )
        if not tokens.confirmed:
            try:
                max_tokens = self._fit(spec, tokens.ids, request)
                return self._bind(spec, tokens, max_tokens, request, caller)
            except InvalidArgument:
                # Refused on the router's own ids (an overflow): the service's ids decide.
                tokens = await tokens.from_service()
        return self._bind(spec, tokens, self._fit(spec, tokens.ids, request), request, caller)

    @staticmethod
    def _fit(spec: ModelSpec, prompt: list[int], request: GenerationRequest) -> int:
        """The effective max_tokens; INVALID_ARGUMENT when prompt + max_tokens overflow."""
        return check_max_tokens(
            request.sampling,
            len(prompt),
            spec.context_length,
            spec.default_max_tokens,
            prompt_field=_prompt_field(request),
        )

    def _rebind(self, prepared: Prepared, ids: list[int], caller: Caller) -> Prepared:
        """`prepared` on the tokenizer service's ids, after they contradicted the router's."""
        spec, request = prepared.spec, prepared.request
        tokens = PromptTokens(ids)
        return self._bind(spec, tokens, self._fit(spec, ids, request), request, caller)

    async def _prepare_auto(
        self, request: GenerationRequest, caller: Caller, allowed: frozenset[str]
    ) -> Prepared:
        # The cascade documented on ModelRouter: first candidate that fits and can serve.
        candidates = self._router.auto_candidates(caller, allowed)
        if not candidates:
            raise InvalidArgument([FieldViolation("model", "no model is available to `auto`")])
        fitting = 0
        for spec in candidates:
            tokens = await self._tokenizer.prompt_tokens(
                spec.name, request, tenant=caller.tenant_id, speculate=False
            )
            prompt, s = tokens.ids, request.sampling
            if not fits_context(s, len(prompt), spec.context_length, spec.default_max_tokens):
                continue
            fitting += 1
            deployments = self._router.deployment_order(spec, caller.regions)
            if not self._dispatcher.has_usable_replica(deployments):
                continue
            max_tokens = check_max_tokens(
                s, len(prompt), spec.context_length, spec.default_max_tokens, prompt_field="-"
            )
            return self._bind(spec, tokens, max_tokens, request, caller)
        if fitting:
            raise Unavailable("no model for `auto` can serve now", retry_after_s=1.0)
        raise InvalidArgument(
            [
                FieldViolation(
                    _prompt_field(request),
                    "prompt + max_tokens fit the context of no model available to `auto`",
                )
            ]
        )

    def _bind(
        self,
        spec: ModelSpec,
        tokens: PromptTokens,
        max_tokens: int,
        request: GenerationRequest,
        caller: Caller,
    ) -> Prepared:
        sampling = common_pb2.SamplingParams()
        sampling.CopyFrom(request.sampling)
        sampling.max_tokens = max_tokens
        forced = request.forced_function
        if forced is not None:
            # tool_choice required or named: the call is guaranteed by constrained decoding.
            sampling.format.CopyFrom(
                forced_format(
                    spec.tool_parser,
                    request.tools,
                    function_name=forced or None,
                    # A named function is called once (as OpenAI does); `required` may call
                    # several when parallel calls are allowed.
                    parallel=request.parallel_tool_calls and not forced,
                )
            )
        deployments = self._router.deployment_order(spec, caller.regions)
        if not deployments:
            raise Unavailable(f"model {spec.name!r} has no deployment", retry_after_s=60.0)
        return Prepared(spec, tokens, sampling, deployments, request)

    async def _admit(self, prepared: Prepared, caller: Caller, policy: TenantPolicy) -> Admission:
        if not prepared.tokens.confirmed:  # admission counts the service's tokens only
            with phase(self._metrics, "tokenize_confirm"):
                await admitted_ids(prepared.tokens, self._metrics.speculated)
        request = prepared.request
        with phase(self._metrics, "admission"):
            return await self._admitter.admit(
                request_id=billing_id(caller, request.request_id, request.fingerprint),
                caller=caller,
                model=prepared.spec.name,
                prompt_tokens=len(prepared.prompt),
                max_tokens=prepared.sampling.max_tokens,
                policy=policy.admission,
            )

    async def _dispatch(self, prepared: Prepared, stream: bool) -> Started:
        with phase(self._metrics, "route", model=prepared.spec.name) as span:
            started = await self._dispatcher.generate(
                prepared.spec.name,
                prepared.deployments,
                prepared.prompt,
                prepared.sampling,
                stream=stream,
            )
            span.set_attribute("replica", started.placed.choice.replica)
            span.set_attribute("reason", started.placed.choice.reason)
        return started

    def _generation(
        self,
        info: RequestInfo,
        source: CachedSource | LiveSource,
        policy: TenantPolicy,
        admission: Admission,
        key: cache_pb.CacheKey | None,
    ) -> Generation:
        return Generation(info, source, policy.output, admission, self._deps(key))

    def _deps(self, key: cache_pb.CacheKey | None) -> Generation.Deps:
        store = self._cache if key is not None else None
        return Generation.Deps(
            settler=self._settler,
            metrics=self._metrics,
            background=self._background,
            cache=store,
            cache_key=key,
        )


def _abandon_reason(error: BaseException) -> str:
    if isinstance(error, UnconfirmedTokensError):
        return "unconfirmed"
    return "refused" if isinstance(error, ServiceError) else "cancelled"


def _with_content(message: common_pb2.ChatMessage, text: str) -> common_pb2.ChatMessage:
    """The message with screened content (tool calls and ids kept)."""
    copy = common_pb2.ChatMessage()
    copy.CopyFrom(message)
    copy.content = text
    return copy


def _prompt_field(request: GenerationRequest) -> str:
    return "messages" if request.kind is Kind.CHAT else "prompt"
