"""Engine values -> protobuf messages (responses, load reports, deployment info)."""

from __future__ import annotations

import time

from google.protobuf import timestamp_pb2

from llm_inference.engine.api import (
    EngineInfo,
    FinishReason,
    LoadSnapshot,
    RequestTimings,
    TokenEvent,
    TopToken,
)
from llm_inference.token_bytes import TokenBytes
from llmapi.common.v1 import common_pb2
from llmapi.inference.v1 import inference_service_pb2 as pb

FINISH_REASONS = {
    FinishReason.STOP: common_pb2.FINISH_REASON_STOP,
    FinishReason.LENGTH: common_pb2.FINISH_REASON_LENGTH,
    FinishReason.CANCELLED: common_pb2.FINISH_REASON_CANCELLED,
    FinishReason.ERROR: common_pb2.FINISH_REASON_ERROR,
}


def generate_response(
    event: TokenEvent, *, detokenize: bool, tokens: TokenBytes | None = None
) -> pb.GenerateResponse:
    """One stream message; the last (finish_reason set) also carries usage and timings.

    `tokens` gives logprobs their token text and raw bytes (left empty without it).
    """
    response = pb.GenerateResponse(token_ids=event.token_ids)
    if detokenize:
        response.text_delta = event.text_delta
    if event.logprobs is not None:
        _add_logprobs(response, event, tokens)
    if event.finish_reason is not None:
        response.finish_reason = FINISH_REASONS[event.finish_reason]
        response.usage.CopyFrom(usage(event))
        if event.timings is not None:
            response.timings.CopyFrom(timings(event.timings))
    return response


def _add_logprobs(
    response: pb.GenerateResponse, event: TokenEvent, tokens: TokenBytes | None
) -> None:
    alternatives: tuple[tuple[TopToken, ...], ...] = event.top_logprobs or ()
    logprobs = event.logprobs or ()
    for i, (token_id, logprob) in enumerate(zip(event.token_ids, logprobs, strict=False)):
        entry = response.logprobs.add(token_id=token_id, logprob=logprob)
        _spell(entry, token_id, tokens)
        for alternative in alternatives[i] if i < len(alternatives) else ():
            top = entry.top_logprobs.add(token_id=alternative.token_id, logprob=alternative.logprob)
            _spell(top, alternative.token_id, tokens)


def _spell(
    entry: common_pb2.TokenLogprob | common_pb2.TopLogprob, token_id: int, tokens: TokenBytes | None
) -> None:
    if tokens is not None:
        entry.token = tokens.text(token_id)
        entry.bytes = tokens.of(token_id)


def usage(event: TokenEvent) -> common_pb2.Usage:
    """Token accounting of a request as of `event`."""
    return common_pb2.Usage(
        prompt_tokens=event.prompt_tokens,
        completion_tokens=event.completion_tokens,
        cached_tokens=min(event.cached_tokens, event.prompt_tokens),
        total_tokens=event.prompt_tokens + event.completion_tokens,
    )


def timings(value: RequestTimings) -> pb.Timings:
    return pb.Timings(
        queue_ms=value.queue_ms,
        prefill_ms=value.prefill_ms,
        ttft_ms=value.ttft_ms,
        decode_ms=value.decode_ms,
    )


def load_report(
    load: LoadSnapshot, replica_id: str, now_ns: int | None = None, *, draining: bool = False
) -> pb.LoadReport:
    """A LoadReport stamped with the wall-clock time (ns since the epoch) it was observed."""
    observed_at = timestamp_pb2.Timestamp()
    observed_at.FromNanoseconds(time.time_ns() if now_ns is None else now_ns)
    return pb.LoadReport(
        replica_id=replica_id,
        num_waiting=load.num_waiting,
        num_running=load.num_running,
        kv_cache_usage=load.kv_cache_usage,
        waiting_prompt_tokens=load.waiting_prompt_tokens,
        running_remaining_tokens=load.running_remaining_tokens,
        tokens_per_second=load.tokens_per_second,
        prefix_cache_hit_rate=load.prefix_cache_hit_rate,
        max_num_seqs=load.max_num_seqs,
        observed_at=observed_at,
        draining=draining,
    )


def info_response(
    info: EngineInfo, *, kind: common_pb2.ModelKind.ValueType, replica_id: str, max_context: int
) -> pb.InfoResponse:
    """Static deployment facts; `max_context` is the limit requests are validated against."""
    return pb.InfoResponse(
        model=info.model,
        kind=kind,
        backend=info.backend,
        dtype=info.dtype,
        device=info.device,
        max_context=max_context,
        kv_block_size=info.kv_block_size,
        kv_blocks_total=info.kv_blocks_total,
        max_num_seqs=info.max_num_seqs,
        max_batched_tokens=info.max_batched_tokens,
        replica_id=replica_id,
    )
