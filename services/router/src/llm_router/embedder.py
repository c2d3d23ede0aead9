"""Embeddings: guard → resolve → admit (bounded estimate) → replica → settle exact tokens."""

from __future__ import annotations

import time
from dataclasses import dataclass

from llm_common.models_config import ModelSpec
from llm_router.admission.admit import NOTHING, Admitter, billing_id
from llm_router.api.identity import SCOPE_EMBEDDING, Caller
from llm_router.observability import RouterMetrics, access_log, digest, phase
from llm_router.requests import EmbedRequest
from llm_router.routing.dispatch import Dispatcher
from llm_router.routing.models import EMBEDDING, ModelRouter
from llm_router.safety import input_guard
from llm_router.safety.policies import PolicyBook
from llm_router.settlement.settle import Outcome, Settler
from llmapi.common.v1 import common_pb2
from llmapi.inference.v1 import inference_service_pb2 as inf_pb

# Special tokens an encoder adds per input ([CLS], [SEP]).
SPECIAL_TOKENS_PER_INPUT = 2


@dataclass(frozen=True, slots=True)
class Embeddings:
    """Vectors in input order and the tokens they cost."""

    model: str
    vectors: list[list[float]]
    usage: common_pb2.Usage


def token_bound(spec: ModelSpec, inputs: tuple[str, ...]) -> int:
    """An upper bound on the tokens of `inputs`, for the reservation: no tokenizer produces
    more tokens than UTF-8 bytes, plus its special tokens, and encoders truncate at their
    context. Settlement then uses the exact count the replica reports."""
    per_input = (len(t.encode("utf-8")) + SPECIAL_TOKENS_PER_INPUT for t in inputs)
    return sum(min(n, spec.context_length) for n in per_input)


class Embedder:
    """Runs Embed requests end to end."""

    def __init__(
        self,
        *,
        router: ModelRouter,
        policies: PolicyBook,
        admitter: Admitter,
        dispatcher: Dispatcher,
        settler: Settler,
        metrics: RouterMetrics,
    ) -> None:
        self._router = router
        self._policies = policies
        self._admitter = admitter
        self._dispatcher = dispatcher
        self._settler = settler
        self._metrics = metrics

    async def embed(self, request: EmbedRequest, caller: Caller, request_id: str) -> Embeddings:
        started = time.perf_counter()
        caller.require_scope(SCOPE_EMBEDDING)
        policy = self._policies.for_tenant(caller.tenant_id)
        screened = input_guard.screen(request.inputs, policy.input, lambda i: f"inputs[{i}]")
        spec = self._router.resolve(request.model, EMBEDDING)
        caller.require_model(spec, policy.admission.allowed_tiers)
        estimate = token_bound(spec, screened.texts)
        with phase(self._metrics, "admission"):
            admission = await self._admitter.admit(
                request_id=billing_id(caller, request.request_id, request.fingerprint),
                caller=caller,
                model=spec.name,
                prompt_tokens=estimate,
                max_tokens=0,
                policy=policy.admission,
            )
        call = inf_pb.EmbedRequest(
            request_id=admission.billing_id, inputs=screened.texts, normalize=request.normalize
        )
        deployments = self._router.deployment_order(spec, caller.regions)
        try:
            with phase(self._metrics, "embed", model=spec.name):
                placed, response = await self._dispatcher.embed(
                    spec.name, deployments, call, estimate
                )
        except BaseException:
            self._settler.submit(admission, NOTHING)
            raise
        tokens = response.prompt_tokens
        stop = common_pb2.FINISH_REASON_STOP
        self._settler.submit(admission, Outcome(tokens, 0, 0, stop, produced=True))
        self._metrics.tokens.labels(spec.name, "prompt").inc(tokens)
        access_log(
            request_id=request_id,
            billing_id=admission.billing_id,
            tenant=caller.tenant_id,
            key_id=caller.key_id,
            user=digest(request.user),
            model=spec.name,
            kind="embed",
            replica=placed.choice.replica,
            inputs=len(request.inputs),
            prompt_tokens=tokens,
            duration_ms=round((time.perf_counter() - started) * 1e3, 3),
        )
        usage = common_pb2.Usage(prompt_tokens=tokens, total_tokens=tokens)
        return Embeddings(spec.name, [list(e.values) for e in response.embeddings], usage)
