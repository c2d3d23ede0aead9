"""Typed clients of the services the router calls: per-call deadlines, breakers, domain errors."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from prometheus_client import Counter

from llm_common.channels import make_channel
from llm_common.deadlines import without_deadline
from llm_common.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    QuotaExceeded,
    ServiceError,
)
from llm_common.logging import get_logger
from llm_common.resilience import AsyncBreaker, BreakerOpen
from llm_router.attestation import Attestation
from llm_router.batching import BatchShape, CallBatcher
from llm_router.errors import DependencyUnavailable, from_rpc_error
from llm_router.load import LoadSnapshot
from llm_router.local_tokenizer import LocalTokenizer
from llm_router.replica_stream import GenerateCall, replica_error
from llm_router.token_memo import TokenMemo, memo_key
from llmapi.auth.v1 import auth_service_pb2 as auth_pb
from llmapi.auth.v1 import auth_service_pb2_grpc as auth_grpc
from llmapi.billing.v1 import billing_service_pb2 as billing_pb
from llmapi.billing.v1 import billing_service_pb2_grpc as billing_grpc
from llmapi.cache.v1 import cache_service_pb2 as cache_pb
from llmapi.cache.v1 import cache_service_pb2_grpc as cache_grpc
from llmapi.common.v1 import common_pb2
from llmapi.inference.v1 import inference_service_pb2 as inf_pb
from llmapi.inference.v1 import inference_service_pb2_grpc as inf_grpc
from llmapi.tokenizer.v1 import tokenizer_service_pb2 as tok_pb
from llmapi.tokenizer.v1 import tokenizer_service_pb2_grpc as tok_grpc

T = TypeVar("T")
BillingCall = billing_pb.SettleRequest | billing_pb.ReleaseRequest
CallResponse = billing_pb.SettleResponse | billing_pb.ReleaseResponse
# Per item of a batch: its response, or the error the unary call would have raised.
ItemResult = CallResponse | Exception
ReserveResult = billing_pb.ReserveResponse | Exception
# Settles and releases coalesced into SettleBatch calls (BillingClient.settle_batch).
SettleBatcher = CallBatcher[BillingCall, CallResponse]
_log = get_logger(__name__)
# After an UNIMPLEMENTED ReserveBatch, how long Reserves stay unary before batching is tried
# again (the billing may have been upgraded meanwhile).
RESERVE_BATCH_RETRY_S = 60.0
# Business answers, not faults: they never trip a breaker.
BUSINESS_ERRORS = (QuotaExceeded, InvalidArgument, NotFound, PermissionDenied, FailedPrecondition)


async def _call(service: str, fn: Callable[[], Awaitable[T]]) -> T:
    try:
        return await fn()
    except grpc.aio.AioRpcError as err:
        raise from_rpc_error(err, service) from None


async def _guarded(breaker: AsyncBreaker | None, service: str, fn: Callable[[], Awaitable[T]]) -> T:
    if breaker is None:
        return await _call(service, fn)
    try:
        return await breaker.call(_call, service, fn)
    except BreakerOpen:
        raise DependencyUnavailable(service) from None


def new_breaker(name: str, *, fail_max: int, reset_s: float) -> AsyncBreaker:
    """A breaker that counts outages and timeouts, not business refusals."""
    return AsyncBreaker(name, fail_max=fail_max, reset_timeout_s=reset_s, exclude=BUSINESS_ERRORS)


@dataclass(frozen=True, slots=True)
class PromptIds:
    """A prompt's token ids. With `confirm` set they are the router's own, computed in-process
    to start work early; `confirm` resolves to the tokenizer service's, which are the answer."""

    ids: list[int]
    confirm: asyncio.Future[list[int]] | None = None


class TokenizerClient:
    """llmapi.tokenizer.v1: the exact prompt tokens. No breaker: without it nothing is admitted.

    Models that `local` serves are tokenized in-process (see local_tokenizer), the rest by the
    service. Models that `speculative` serves are tokenized both ways at once (`*_ids`): the
    in-process ids come back at once, the service's as their confirmation; while the service
    attests the router's files (see attestation), in-process only, with a sampled audit. With
    a memo, an identical prompt from the same tenant is answered from it (see TokenMemo).
    """

    service = "tokenizer"

    def __init__(
        self,
        channel: grpc.aio.Channel,
        timeout_s: float,
        memo: TokenMemo | None = None,
        memo_counter: Counter | None = None,
        local: LocalTokenizer | None = None,
        speculative: LocalTokenizer | None = None,
        attestation: Attestation | None = None,
    ) -> None:
        self._stub = tok_grpc.TokenizerServiceStub(channel)
        self._attestation = attestation
        self._audits: set[asyncio.Task[list[int]]] = set()  # strong references while running
        self._timeout_s = timeout_s
        self._memo = memo
        self._memo_counter = memo_counter
        self._local = local
        self._speculative = speculative
        # Models whose in-process ids the service once contradicted: their files differ from
        # the service's (a skewed rollout), so speculating would only waste replica work.
        self._distrusted: set[str] = set()

    async def chat_prompt(
        self,
        model: str,
        messages: Sequence[common_pb2.ChatMessage],
        *,
        tenant: str = "",
        tools: Sequence[common_pb2.Tool] = (),
    ) -> list[int]:
        """Token ids of the templated conversation, ending with the assistant's turn marker.

        With tools the tokenizer service renders it (the in-process path has no tools)."""
        fetch = self._chat_fetch(model, messages, None if tools else self._local, tools)
        key = memo_key(_chat_parts(tenant, model, messages, tools))
        return await self._memoized(key, fetch)

    async def chat_prompt_ids(
        self,
        model: str,
        messages: Sequence[common_pb2.ChatMessage],
        *,
        tenant: str = "",
        tools: Sequence[common_pb2.Tool] = (),
    ) -> PromptIds:
        """As chat_prompt; speculative for the models `speculative` serves (without tools)."""
        if tools or self._speculative is None or not self._speculates(model):
            return PromptIds(await self.chat_prompt(model, messages, tenant=tenant, tools=tools))
        key = memo_key(_chat_parts(tenant, model, messages))
        guess = self._speculative.chat_prompt(model, messages)
        return await self._speculate(model, key, self._chat_fetch(model, messages, None), guess)

    async def encode(self, model: str, text: str, *, tenant: str = "") -> list[int]:
        """Token ids of a raw prompt, with the tokenizer's special tokens (BOS)."""
        fetch = self._encode_fetch(model, text, self._local)
        return await self._memoized(memo_key(_text_parts(tenant, model, text)), fetch)

    async def encode_ids(self, model: str, text: str, *, tenant: str = "") -> PromptIds:
        """As encode; speculative for the models `speculative` serves."""
        if self._speculative is None or not self._speculates(model):
            return PromptIds(await self.encode(model, text, tenant=tenant))
        key = memo_key(_text_parts(tenant, model, text))
        guess = self._speculative.encode(model, text)
        return await self._speculate(model, key, self._encode_fetch(model, text, None), guess)

    def _chat_fetch(
        self,
        model: str,
        messages: Sequence[common_pb2.ChatMessage],
        local: LocalTokenizer | None,
        tools: Sequence[common_pb2.Tool] = (),
    ) -> Callable[[], Awaitable[list[int]]]:
        async def fetch() -> list[int]:
            if local is not None and local.serves(model):
                return await local.chat_prompt(model, messages)
            request = tok_pb.ApplyChatTemplateRequest(
                model=model, messages=messages, add_generation_prompt=True, tools=tools
            )
            response = await _call(
                self.service,
                lambda: self._stub.ApplyChatTemplate(request, timeout=self._timeout_s),
            )
            return list(response.token_ids)

        return fetch

    def _encode_fetch(
        self, model: str, text: str, local: LocalTokenizer | None
    ) -> Callable[[], Awaitable[list[int]]]:
        async def fetch() -> list[int]:
            if local is not None and local.serves(model):
                return await local.encode(model, text)
            request = tok_pb.EncodeRequest(model=model, texts=[text], add_special_tokens=True)
            response = await _call(
                self.service, lambda: self._stub.Encode(request, timeout=self._timeout_s)
            )
            return list(response.encodings[0].ids)

        return fetch

    def _speculates(self, model: str) -> bool:
        assert self._speculative is not None
        return self._speculative.serves(model) and model not in self._distrusted

    async def _speculate(
        self,
        model: str,
        key: bytes,
        fetch: Callable[[], Awaitable[list[int]]],
        guess: Coroutine[Any, Any, list[int]],
    ) -> PromptIds:
        remembered = self._recall(key)
        if remembered is not None:  # the service's own ids (or attested ones), from the memo
            guess.close()
            return PromptIds(remembered)
        if self._attestation is not None and self._attestation.attested(model):
            prompt = await self._attested(model, fetch, guess)
            # Attested ids are the service's by its own fingerprint; a repeat (a cache hit, a
            # retry) then skips the template and the tokenizer. A differing audit clears them.
            self._remember(key, prompt.ids)
            return prompt
        confirm = asyncio.ensure_future(self._fetch_into_memo(key, fetch))
        confirm.add_done_callback(_retrieve)
        try:
            ids = await guess
        except ServiceError:
            return PromptIds(await confirm)  # the service's answer decides, error or ids
        except Exception:
            _log.warning("in-process tokenization failed, waiting for the service", exc_info=True)
            return PromptIds(await confirm)
        except BaseException:
            confirm.cancel()
            raise
        confirm.add_done_callback(lambda done: self._judge(model, ids, done))
        return PromptIds(ids, confirm)

    async def _attested(
        self,
        model: str,
        fetch: Callable[[], Awaitable[list[int]]],
        guess: Coroutine[Any, Any, list[int]],
    ) -> PromptIds:
        assert self._attestation is not None
        try:
            ids = await guess
        except Exception:  # refused or failed in-process: the service decides, as speculating
            return PromptIds(await fetch())
        if self._attestation.audit():

            async def check() -> list[int]:
                return await fetch()

            # Detached from the request (no deadline, no cancel): it only checks the claim.
            audit = asyncio.get_running_loop().create_task(check(), context=without_deadline())
            self._audits.add(audit)
            audit.add_done_callback(lambda done: self._audited(model, ids, done))
        return PromptIds(ids)

    def _audited(self, model: str, guess: list[int], audit: asyncio.Task[list[int]]) -> None:
        self._audits.discard(audit)
        if audit.cancelled() or audit.exception() is not None:
            return
        assert self._attestation is not None
        equal = audit.result() == guess
        if not equal and self._memo is not None:
            self._memo.clear()  # it may hold attested ids that were not the service's
        self._attestation.audited(model, equal=equal)

    async def fingerprint(self, model: str) -> str:
        """The service's tokenizer fingerprint of `model` (Info)."""
        request = tok_pb.InfoRequest(model=model)
        response = await _call(
            self.service, lambda: self._stub.Info(request, timeout=self._timeout_s)
        )
        return response.fingerprint

    async def aclose(self) -> None:
        """Cancel the audits still in flight (shutdown)."""
        for audit in list(self._audits):
            audit.cancel()
        await asyncio.gather(*self._audits, return_exceptions=True)

    def _judge(self, model: str, guess: list[int], confirm: asyncio.Future[list[int]]) -> None:
        if confirm.cancelled() or confirm.exception() is not None or confirm.result() == guess:
            return
        if model not in self._distrusted:
            self._distrusted.add(model)
            _log.warning(
                "the tokenizer service's prompt tokens differ from the router's own (their"
                " tokenizer files differ); this model is not speculated on until restart",
                model=model,
            )

    async def _memoized(self, key: bytes, fetch: Callable[[], Awaitable[list[int]]]) -> list[int]:
        ids = self._recall(key)
        if ids is None:
            ids = await self._fetch_into_memo(key, fetch)
        return ids

    def _recall(self, key: bytes) -> list[int] | None:
        if self._memo is None:
            return None
        ids = self._memo.get(key)
        if self._memo_counter is not None:
            self._memo_counter.labels("miss" if ids is None else "hit").inc()
        return ids

    async def _fetch_into_memo(
        self, key: bytes, fetch: Callable[[], Awaitable[list[int]]]
    ) -> list[int]:
        ids = await fetch()
        self._remember(key, ids)
        return ids

    def _remember(self, key: bytes, ids: list[int]) -> None:
        if self._memo is not None:
            self._memo.put(key, ids)


def _chat_parts(
    tenant: str,
    model: str,
    messages: Sequence[common_pb2.ChatMessage],
    tools: Sequence[common_pb2.Tool] = (),
) -> Iterable[bytes]:
    yield from (b"chat", tenant.encode(), model.encode())
    yield from (m.SerializeToString(deterministic=True) for m in messages)
    if tools:  # after the messages: a conversation without tools keeps its old key
        yield b"tools"
        yield from (t.SerializeToString(deterministic=True) for t in tools)


def _text_parts(tenant: str, model: str, text: str) -> Iterable[bytes]:
    return (b"text", tenant.encode(), model.encode(), text.encode("utf-8", "surrogatepass"))


def _retrieve(future: asyncio.Future[Any]) -> None:
    # A confirmation nobody awaits any more (its request failed first) must not be reported
    # as a lost exception.
    if not future.cancelled():
        future.exception()


class QuotaClient:
    """Tokens-per-minute reservations at the auth service."""

    service = "auth"

    def __init__(
        self, channel: grpc.aio.Channel, timeout_s: float, breaker: AsyncBreaker | None
    ) -> None:
        self._stub = auth_grpc.AuthServiceStub(channel)
        self._timeout_s = timeout_s
        self._breaker = breaker

    async def reserve(
        self, tenant: str, key: str, tokens: int, reservation_id: str
    ) -> auth_pb.ReserveTokensResponse:
        """Hold `tokens`; RESOURCE_EXHAUSTED (QuotaExceeded) over the key's limit.

        Nothing was held (and nothing is to be refunded) when the answer's `limit` is 0: the
        key is unlimited (`enforced`), or auth's limiter was down and it failed open.
        """
        request = auth_pb.ReserveTokensRequest(
            tenant_id=tenant, key_id=key, tokens=tokens, reservation_id=reservation_id
        )
        response: auth_pb.ReserveTokensResponse = await _guarded(
            self._breaker,
            self.service,
            lambda: self._stub.ReserveTokens(request, timeout=self._timeout_s),
        )
        return response

    async def refund(
        self, tenant: str, key: str, reservation_id: str, tokens: int, timeout_s: float
    ) -> None:
        """Give back `tokens` of a reservation (idempotent per reservation)."""
        request = auth_pb.RefundTokensRequest(
            tenant_id=tenant, key_id=key, reservation_id=reservation_id, tokens=tokens
        )
        await _guarded(
            self._breaker, self.service, lambda: self._stub.RefundTokens(request, timeout=timeout_s)
        )


class BillingClient:
    """Two-phase metering at the billing service.

    With `reserve_batch`, the Reserve calls of concurrent admissions share ReserveBatch calls
    (a lone one still goes out at once, as a unary Reserve). A billing that predates
    ReserveBatch answers UNIMPLEMENTED: Reserves are then unary calls for
    `reserve_batch_retry_s`, after which batching is tried again.
    """

    service = "billing"

    def __init__(
        self,
        channel: grpc.aio.Channel,
        timeout_s: float,
        breaker: AsyncBreaker | None,
        *,
        reserve_batch: BatchShape | None = None,
        reserve_batch_retry_s: float = RESERVE_BATCH_RETRY_S,
    ) -> None:
        self._stub = billing_grpc.BillingServiceStub(channel)
        self._timeout_s = timeout_s
        self._breaker = breaker
        self._reserves: (
            CallBatcher[billing_pb.ReserveRequest, billing_pb.ReserveResponse] | None
        ) = None
        if reserve_batch is not None:
            self._reserves = CallBatcher(
                self.reserve_batch,
                max_items=reserve_batch.max_items,
                wait_s=reserve_batch.wait_s,
                timeout_s=timeout_s,
                max_in_flight=reserve_batch.max_in_flight,
                span_name="router.reserve_batch",
            )
        self._batch_retry_s = reserve_batch_retry_s
        self._unary_reserves_until = 0.0  # monotonic time; set by an UNIMPLEMENTED answer

    async def reserve(self, request: billing_pb.ReserveRequest) -> billing_pb.ReserveResponse:
        """Hold the worst-case cost; QuotaExceeded over a hard budget."""
        if self._reserves is not None:
            return await self._reserves.submit(request)
        return await self._reserve_one(request, self._timeout_s)

    async def _reserve_one(
        self, request: billing_pb.ReserveRequest, timeout_s: float
    ) -> billing_pb.ReserveResponse:
        return await _guarded(
            self._breaker, self.service, lambda: self._stub.Reserve(request, timeout=timeout_s)
        )

    async def reserve_batch(
        self, requests: Sequence[billing_pb.ReserveRequest], timeout_s: float
    ) -> list[ReserveResult]:
        """Reserve many requests in one call; per request its response or the domain error
        the unary call would have raised. A failure of the whole call is raised."""
        if len(requests) == 1 or time.monotonic() < self._unary_reserves_until:
            # One item, or an older billing: unary calls, each with its own outcome.
            return list(
                await asyncio.gather(*(self._reserve_outcome(r, timeout_s) for r in requests))
            )
        request = billing_pb.ReserveBatchRequest(items=requests)
        response = await _guarded(
            self._breaker, self.service, lambda: self._reserve_batch_call(request, timeout_s)
        )
        if response is None:  # UNIMPLEMENTED: this billing has no ReserveBatch
            self._unary_reserves_until = time.monotonic() + self._batch_retry_s
            _log.warning(
                "billing has no ReserveBatch: reserving with unary calls",
                retry_in_s=self._batch_retry_s,
            )
            return await self.reserve_batch(requests, timeout_s)
        if len(response.results) != len(requests):  # a broken billing: treat it as down
            raise DependencyUnavailable(self.service)
        return [_reserve_result(r, self.service) for r in response.results]

    async def _reserve_outcome(
        self, request: billing_pb.ReserveRequest, timeout_s: float
    ) -> ReserveResult:
        try:
            return await self._reserve_one(request, timeout_s)
        except Exception as err:  # the item's own outcome, as a batch item's status is
            return err

    async def _reserve_batch_call(
        self, request: billing_pb.ReserveBatchRequest, timeout_s: float
    ) -> billing_pb.ReserveBatchResponse | None:
        try:
            return await self._stub.ReserveBatch(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                return None
            raise

    async def settle(
        self, request: billing_pb.SettleRequest, timeout_s: float
    ) -> billing_pb.SettleResponse:
        """Record the actual usage (idempotent by request id)."""
        return await _guarded(
            self._breaker, self.service, lambda: self._stub.Settle(request, timeout=timeout_s)
        )

    async def release(self, request_id: str, tenant_id: str, timeout_s: float) -> bool:
        """Cancel a reservation that produced nothing."""
        request = billing_pb.ReleaseRequest(request_id=request_id, tenant_id=tenant_id)
        response = await _guarded(
            self._breaker, self.service, lambda: self._stub.Release(request, timeout=timeout_s)
        )
        return response.released

    async def settle_batch(
        self, calls: Sequence[BillingCall], timeout_s: float
    ) -> list[ItemResult]:
        """Settle/Release many requests in one call; per call its response or the domain
        error the unary call would have raised. A failure of the whole call is raised."""
        request = billing_pb.SettleBatchRequest(items=[_batch_item(c) for c in calls])
        response = await _guarded(
            self._breaker, self.service, lambda: self._stub.SettleBatch(request, timeout=timeout_s)
        )
        if len(response.results) != len(calls):  # a broken billing: treat it as down
            raise DependencyUnavailable(self.service)
        return [_item_result(r, self.service) for r in response.results]


def _batch_item(call: BillingCall) -> billing_pb.SettleBatchItem:
    if isinstance(call, billing_pb.SettleRequest):
        return billing_pb.SettleBatchItem(settle=call)
    return billing_pb.SettleBatchItem(release=call)


def _item_result(result: billing_pb.SettleBatchResult, service: str) -> ItemResult:
    if result.status.code != grpc.StatusCode.OK.value[0]:
        return from_rpc_error(_ItemStatusError(result.status), service)
    if result.WhichOneof("response") == "release":
        return result.release
    return result.settle


def _reserve_result(result: billing_pb.ReserveBatchResult, service: str) -> ReserveResult:
    if result.status.code != grpc.StatusCode.OK.value[0]:
        return from_rpc_error(_ItemStatusError(result.status), service)
    return result.reservation


class _ItemStatusError(grpc.RpcError):
    """A batch item's status as a caught RpcError, so that it maps to the same domain
    error (details included) as a failed unary call."""

    def __init__(self, status: billing_pb.BatchItemStatus) -> None:
        super().__init__(status.message)
        self._status = status
        codes = {c.value[0]: c for c in grpc.StatusCode}
        self._code = codes.get(status.code, grpc.StatusCode.UNKNOWN)

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._status.message

    def trailing_metadata(self) -> tuple[Any, ...]:  # (key, value) pairs
        # BatchItemStatus has google.rpc.Status's wire format.
        return (("grpc-status-details-bin", self._status.SerializeToString()),)


class CacheClient:
    """The response cache; callers treat its failures as misses."""

    service = "cache"

    def __init__(
        self, channel: grpc.aio.Channel, timeout_s: float, breaker: AsyncBreaker | None
    ) -> None:
        self._stub = cache_grpc.CacheServiceStub(channel)
        self._timeout_s = timeout_s
        self._breaker = breaker

    async def lookup(self, request: cache_pb.LookupRequest) -> cache_pb.LookupResponse:
        return await _guarded(
            self._breaker, self.service, lambda: self._stub.Lookup(request, timeout=self._timeout_s)
        )

    async def store(self, request: cache_pb.StoreRequest, timeout_s: float) -> bool:
        response = await _guarded(
            self._breaker, self.service, lambda: self._stub.Store(request, timeout=timeout_s)
        )
        return response.stored

    async def record_hits(self, hits: Sequence[cache_pb.RecordedHit], timeout_s: float) -> int:
        """Account exact hits served from the router's near cache."""
        request = cache_pb.RecordHitsRequest(hits=hits)
        response = await _guarded(
            self._breaker, self.service, lambda: self._stub.RecordHits(request, timeout=timeout_s)
        )
        return response.recorded

    async def watch_changes(self) -> AsyncIterator[cache_pb.WatchChangesResponse]:
        """The cache's change feed until the stream breaks (AioRpcError). No breaker: a
        long-lived stream is no sample of the cache's health."""
        call = self._stub.WatchChanges(cache_pb.WatchChangesRequest())
        try:
            async for message in call:
                yield message
        finally:
            call.cancel()


class ReplicaChannels:
    """How to reach a replica: directly (a channel per address) or through the mesh (one
    channel to Envoy, the replica named in a header for its ORIGINAL_DST cluster).

    Channels are made without gRPC-level retries: the router re-dispatches to another
    replica itself, and a hop must not be retried at two layers.
    """

    def __init__(self, *, mesh_addr: str | None = None, mesh_header: str = "") -> None:
        self._mesh_addr = mesh_addr
        self._mesh_header = mesh_header
        self._channels: dict[str, grpc.aio.Channel] = {}

    def stub(
        self, replica: str
    ) -> tuple[inf_grpc.InferenceServiceAsyncStub, tuple[tuple[str, str], ...]]:
        """The stub to call and the metadata that routes the call to `replica`."""
        if self._mesh_addr is not None:
            return self._stub_for(self._mesh_addr), ((self._mesh_header, replica),)
        return self._stub_for(replica), ()

    def _stub_for(self, target: str) -> inf_grpc.InferenceServiceAsyncStub:
        channel = self._channels.get(target)
        if channel is None:
            channel = self._channels[target] = make_channel(target, retry_unavailable=False)
        return inf_grpc.InferenceServiceStub(channel)

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close()


class InferenceClient:
    """Generate, Embed and WatchLoad on a chosen replica."""

    service = "inference"

    def __init__(self, channels: ReplicaChannels) -> None:
        self._channels = channels

    def generate(
        self, replica: str, request: inf_pb.GenerateRequest, *, stop_timeout_s: float = 1.0
    ) -> GenerateCall:
        """Start a stream; its deadline is the caller's remaining one. Stopping it early waits
        `stop_timeout_s` at most for the replica's count."""
        stub, metadata = self._channels.stub(replica)

        async def stop(timeout_s: float) -> int:
            reply = await stub.Stop(
                inf_pb.StopRequest(request_id=request.request_id),
                metadata=metadata,
                timeout=timeout_s,
            )
            return reply.stopped

        return GenerateCall(
            replica, stub.Generate(request, metadata=metadata), stop, stop_timeout_s
        )

    async def embed(self, replica: str, request: inf_pb.EmbedRequest) -> inf_pb.EmbedResponse:
        stub, metadata = self._channels.stub(replica)
        try:
            # No own timeout: a large batch may take long; the caller's deadline bounds it.
            response: inf_pb.EmbedResponse = await stub.Embed(request, metadata=metadata)
        except grpc.aio.AioRpcError as err:
            raise replica_error(replica, err) from None
        return response

    async def watch_load(self, replica: str, interval_ms: int) -> AsyncIterator[LoadSnapshot]:
        """Load reports from `replica` until the stream breaks (AioRpcError)."""
        stub, metadata = self._channels.stub(replica)
        call = stub.WatchLoad(inf_pb.WatchLoadRequest(interval_ms=interval_ms), metadata=metadata)
        try:
            async for message in call:
                yield snapshot_from(message.load)
        finally:
            call.cancel()


def snapshot_from(report: inf_pb.LoadReport) -> LoadSnapshot:
    """The domain copy of a LoadReport."""
    return LoadSnapshot(
        num_waiting=report.num_waiting,
        num_running=report.num_running,
        kv_cache_usage=report.kv_cache_usage,
        waiting_prompt_tokens=report.waiting_prompt_tokens,
        running_remaining_tokens=report.running_remaining_tokens,
        tokens_per_second=report.tokens_per_second,
        max_num_seqs=max(1, report.max_num_seqs),
    )
