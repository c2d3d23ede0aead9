"""Dispatch to a replica with failover: a request that fails before its first token, or gets
none within the first-token timeout (a frozen replica), is sent to another replica after a
jittered backoff; UNAVAILABLE with RetryInfo when none is left. A stream that breaks after
output began is resumed on another replica the same way (`resume`)."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TypeVar

import grpc

from llm_common.errors import Unavailable
from llm_common.logging import get_logger
from llm_common.models_config import Deployment
from llm_common.resilience import Backoff
from llm_router.clients.inference import InferenceClient
from llm_router.errors import ReplicaFailed
from llm_router.observability import RouterMetrics
from llm_router.routing.discovery.fleet import Fleet
from llm_router.routing.load import LoadBoard, Ticket
from llm_router.routing.replica_stream import GenerateCall
from llm_router.routing.selection import Choice, Job, ReplicaSelector
from llm_router.routing.settings import RoutingSettings
from llmapi.common.v1 import common_pb2
from llmapi.inference.v1 import inference_service_pb2 as inf_pb

T = TypeVar("T")
_log = get_logger(__name__)
# RetryInfo when every replica failed but none is excluded (they were busy).
BUSY_RETRY_S = 1.0


@dataclass(frozen=True, slots=True)
class Placed:
    """A request running on a replica: where, why, and its load ticket (finish it!)."""

    deployment: Deployment
    choice: Choice
    ticket: Ticket
    attempts: int


@dataclass(frozen=True, slots=True)
class Target:
    """What a Generate was placed for: a migration places the same request again."""

    model: str
    deployments: Sequence[Deployment]
    prompt: Sequence[int]
    sampling: common_pb2.SamplingParams
    stream: bool


@dataclass(frozen=True, slots=True)
class Started:
    """A Generate stream that has produced its first message."""

    placed: Placed
    call: GenerateCall
    first: inf_pb.GenerateResponse
    target: Target


class Dispatcher:
    """Places requests on replicas (ReplicaSelector) and retries elsewhere on failure."""

    def __init__(
        self,
        selector: ReplicaSelector,
        board: LoadBoard,
        inference: InferenceClient,
        settings: RoutingSettings,
        metrics: RouterMetrics,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: random.Random | None = None,
        fleet: Fleet | None = None,
    ) -> None:
        self._selector = selector
        self._fleet = fleet or Fleet()  # which replicas each deployment has now
        self._board = board
        self._inference = inference
        self._metrics = metrics
        self._attempts = settings.dispatch_attempts
        self._first_token_timeout_s = settings.first_token_timeout_s or None
        self._backoff = Backoff(
            base=settings.retry_base_s, cap=settings.retry_cap_s, jitter=settings.retry_jitter_s
        )
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._stop_timeout_s = settings.stop_timeout_s
        # Streamed answers: tokens grouped at a bounded delay. Unary ones: the caller sees
        # only the whole answer, so messages are as full as the replica allows.
        self._delivery = {
            True: inf_pb.Delivery(
                max_tokens_per_message=settings.tokens_per_message,
                max_hold_ms=settings.max_hold_ms,
            ),
            False: inf_pb.Delivery(max_tokens_per_message=settings.unary_tokens_per_message),
        }

    def finish(self, ticket: Ticket) -> None:
        """A placed request ended: it no longer loads its replica."""
        self._board.finish(ticket)

    def fail(self, replica: str) -> None:
        """A replica broke mid-stream: exclude it like one that failed before the first token."""
        self._board.fail(replica)

    def has_usable_replica(self, deployments: Sequence[Deployment]) -> bool:
        """Whether any replica of `deployments` is not excluded right now."""
        return any(
            self._selector.choose(_probe_job(d), self._fleet.replicas(d)) is not None
            for d in deployments
        )

    async def generate(
        self,
        model: str,
        deployments: Sequence[Deployment],
        prompt: Sequence[int],
        sampling: common_pb2.SamplingParams,
        *,
        stream: bool = True,
    ) -> Started:
        """Start Generate on the best replica and wait for its first message, failing over.
        `stream`: the caller receives the answer as it comes (else only when it is whole)."""
        target = Target(model, deployments, prompt, sampling, stream)
        return await self._start(target, None, ())

    async def resume(
        self, started: Started, resume: inf_pb.Resume, exclude: Collection[str]
    ) -> Started:
        """Continue `started`'s request on another replica (not in `exclude`) from the tokens
        and text already delivered; Unavailable when no replica can take it."""
        model = started.target.model
        try:
            resumed = await self._start(started.target, resume, exclude)
        except BaseException:
            self._metrics.migrations.labels(model, "lost").inc()
            raise
        self._metrics.migrations.labels(model, "resumed").inc()
        return resumed

    async def _start(
        self, target: Target, resume: inf_pb.Resume | None, exclude: Collection[str]
    ) -> Started:
        prompt, sampling, stream = target.prompt, target.sampling, target.stream
        resumed = 0 if resume is None else len(resume.token_ids)
        # Tokens still to generate: the job's decode work, and what is left once prefilled.
        left = max(sampling.max_tokens - resumed, 1) if resumed else sampling.max_tokens

        async def attempt(placed: Placed) -> Started:
            request = inf_pb.GenerateRequest(
                request_id=uuid.uuid4().hex,  # unique: Stop ends this attempt's stream only
                prompt_token_ids=prompt,
                sampling=sampling,
                detokenize=True,
                delivery=self._delivery[stream],
                resume=resume,
            )
            replica = placed.choice.replica
            call = self._inference.generate(replica, request, stop_timeout_s=self._stop_timeout_s)
            try:
                async with asyncio.timeout(self._first_token_timeout_s):
                    first = await call.next()
            except TimeoutError:
                call.cancel()
                raise ReplicaFailed(replica, grpc.StatusCode.DEADLINE_EXCEEDED) from None
            except BaseException:
                call.cancel()
                raise
            if first is None:  # a stream must end with a finish message: the replica broke
                raise ReplicaFailed(replica, grpc.StatusCode.DATA_LOSS)
            self._board.prefilled(placed.ticket, float(left))
            return Started(placed, call, first, target)

        def job(deployment: Deployment) -> Job:
            chain = self._selector.chain(deployment.name, prompt)
            return Job(deployment.name, chain, len(prompt) + resumed, left)

        return await self.place(target.model, target.deployments, job, attempt, exclude)

    async def embed(
        self,
        model: str,
        deployments: Sequence[Deployment],
        request: inf_pb.EmbedRequest,
        tokens: int,
    ) -> tuple[Placed, inf_pb.EmbedResponse]:
        """Embed on the least loaded replica, failing over (Embed is idempotent)."""

        async def attempt(placed: Placed) -> tuple[Placed, inf_pb.EmbedResponse]:
            return placed, await self._inference.embed(placed.choice.replica, request)

        def job(deployment: Deployment) -> Job:
            return Job(deployment.name, (), tokens, 0)

        placed, response = await self.place(model, deployments, job, attempt)
        self._board.finish(placed.ticket)
        return placed, response

    async def place(
        self,
        model: str,
        deployments: Sequence[Deployment],
        job_for: Callable[[Deployment], Job],
        attempt: Callable[[Placed], Awaitable[T]],
        exclude: Collection[str] = (),
    ) -> T:
        """Run `attempt` on a chosen replica (none in `exclude`); on ReplicaFailed exclude it,
        back off, retry on another one (next deployment when a deployment has none left)."""
        tried: set[str] = set(exclude)
        jobs = {d.name: job_for(d) for d in deployments}
        for number in range(1, self._attempts + 1):
            placed = self._choose(deployments, jobs, tried, number)
            if placed is None:
                break
            replica = placed.choice.replica
            try:
                result = await attempt(placed)
            except ReplicaFailed as failure:
                self._board.finish(placed.ticket)
                self._failed(model, failure, tried)
                if number < self._attempts:
                    await self._sleep(self._backoff.delay(number, self._rng))
                continue
            except BaseException:
                self._board.finish(placed.ticket)
                raise
            self._board.succeed(replica)
            self._selector.record(jobs[placed.deployment.name], replica)
            self._metrics.routed.labels(model, replica, placed.choice.reason).inc()
            return result
        raise self._unavailable(model, deployments)

    def _choose(
        self,
        deployments: Sequence[Deployment],
        jobs: dict[str, Job],
        tried: set[str],
        number: int,
    ) -> Placed | None:
        for deployment in deployments:
            job = jobs[deployment.name]
            choice = self._selector.choose(job, self._fleet.replicas(deployment), exclude=tried)
            if choice is not None:
                ticket = self._board.begin(choice.replica, choice.work)
                return Placed(deployment, choice, ticket, number)
        return None

    def _failed(self, model: str, failure: ReplicaFailed, tried: set[str]) -> None:
        tried.add(failure.replica)
        excluded_s = self._board.fail(failure.replica) if failure.exclude else 0.0
        self._metrics.failovers.labels(model, failure.replica, failure.code.name).inc()
        _log.warning(
            "replica failed before the first token",
            replica=failure.replica,
            code=failure.code.name,
            excluded_s=excluded_s,
        )

    def _unavailable(self, model: str, deployments: Sequence[Deployment]) -> Unavailable:
        replicas = [r for d in deployments for r in self._fleet.replicas(d)]
        wait = self._board.retry_after(replicas) or BUSY_RETRY_S
        return Unavailable(f"no replica of model {model!r} can serve now", retry_after_s=wait)


def _probe_job(deployment: Deployment) -> Job:
    return Job(deployment.name, (), 1, 1)
