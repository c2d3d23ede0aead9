"""Engine values -> protobuf: stream messages, usage, load reports, deployment info."""

from __future__ import annotations

from dataclasses import replace

from llm_inference import convert
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


def event(
    finish: FinishReason | None = None, logprobs: tuple[float, ...] | None = None
) -> TokenEvent:
    timings = RequestTimings(1.0, 2.0, 3.0, 4.0) if finish else None
    return TokenEvent(
        token_ids=(7, 8), text_delta="hi", logprobs=logprobs, finish_reason=finish,
        prompt_tokens=5, completion_tokens=2, cached_tokens=4, timings=timings,
    )  # fmt: skip


def test_intermediate_message_has_tokens_only() -> None:
    msg = convert.generate_response(event(), detokenize=False)
    assert list(msg.token_ids) == [7, 8]
    assert msg.text_delta == ""
    assert msg.finish_reason == common_pb2.FINISH_REASON_UNSPECIFIED
    assert not msg.HasField("usage")
    assert not msg.HasField("timings")


def test_last_message_has_finish_reason_usage_and_timings() -> None:
    msg = convert.generate_response(event(FinishReason.STOP), detokenize=True)
    assert msg.text_delta == "hi"
    assert msg.finish_reason == common_pb2.FINISH_REASON_STOP
    assert msg.usage == common_pb2.Usage(
        prompt_tokens=5, completion_tokens=2, cached_tokens=4, total_tokens=7
    )
    assert (msg.timings.queue_ms, msg.timings.prefill_ms) == (1.0, 2.0)
    assert (msg.timings.ttft_ms, msg.timings.decode_ms) == (3.0, 4.0)


def test_finish_reasons_map() -> None:
    expected = {
        FinishReason.STOP: common_pb2.FINISH_REASON_STOP,
        FinishReason.LENGTH: common_pb2.FINISH_REASON_LENGTH,
        FinishReason.CANCELLED: common_pb2.FINISH_REASON_CANCELLED,
        FinishReason.ERROR: common_pb2.FINISH_REASON_ERROR,
    }
    for reason, code in expected.items():
        assert convert.generate_response(event(reason), detokenize=False).finish_reason == code


TOKENS = TokenBytes((b"", b"", b"", b"", b"", b"", b"", b" a", b"\xe2", b"\xe2\x82"))


def test_logprobs_carry_token_text_and_raw_bytes() -> None:
    msg = convert.generate_response(event(logprobs=(-0.5, -1.5)), detokenize=False, tokens=TOKENS)
    assert [(lp.token_id, lp.token, lp.logprob, lp.bytes) for lp in msg.logprobs] == [
        (7, " a", -0.5, b" a"),
        (8, "\ufffd", -1.5, b"\xe2"),  # a partial character keeps its byte
    ]
    assert all(not lp.top_logprobs for lp in msg.logprobs)


def test_top_logprobs_carry_alternatives_per_token() -> None:
    top = ((TopToken(7, -0.5), TopToken(9, -1.0)), (TopToken(8, -1.5),))
    msg = convert.generate_response(
        replace(event(logprobs=(-0.5, -1.5)), top_logprobs=top), detokenize=False, tokens=TOKENS
    )
    first, second = msg.logprobs
    assert [(t.token_id, t.token, t.logprob, t.bytes) for t in first.top_logprobs] == [
        (7, " a", -0.5, b" a"),
        (9, "\ufffd", -1.0, b"\xe2\x82"),
    ]
    assert [t.token_id for t in second.top_logprobs] == [8]


def test_logprobs_without_a_tokenizer_have_no_text() -> None:
    msg = convert.generate_response(event(logprobs=(-0.5, -1.5)), detokenize=False)
    assert [(lp.token, lp.bytes) for lp in msg.logprobs] == [("", b""), ("", b"")]


def test_load_report_and_info() -> None:
    load = LoadSnapshot(
        num_waiting=1, num_running=2, kv_blocks_total=10, kv_blocks_free=4, kv_cache_usage=0.6,
        waiting_prompt_tokens=30, running_remaining_tokens=50, tokens_per_second=9.5,
        prefix_cache_hit_rate=0.5, max_num_seqs=8,
    )  # fmt: skip
    report = convert.load_report(load, "r1", now_ns=1_700_000_000_250_000_000)
    assert (report.replica_id, report.num_waiting, report.num_running) == ("r1", 1, 2)
    assert abs(report.kv_cache_usage - 0.6) < 1e-6
    assert (report.waiting_prompt_tokens, report.running_remaining_tokens) == (30, 50)
    assert report.max_num_seqs == 8
    assert report.observed_at.seconds == 1_700_000_000
    assert report.observed_at.nanos == 250_000_000
    info = EngineInfo("m", "torch", "float32", "cpu", 4096, 16, 100, 64, 2048)
    msg = convert.info_response(
        info, kind=common_pb2.MODEL_KIND_GENERATION, replica_id="r1", max_context=2048
    )
    assert (msg.model, msg.backend, msg.dtype, msg.device) == ("m", "torch", "float32", "cpu")
    assert (msg.max_context, msg.kv_block_size, msg.kv_blocks_total) == (2048, 16, 100)
    assert (msg.max_num_seqs, msg.max_batched_tokens, msg.replica_id) == (64, 2048, "r1")
