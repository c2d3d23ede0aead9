"""InferenceService on a real grpc.aio server (port 0) with the real PyTorch engine on the demo
checkpoint: streaming, cancellation, deadlines, bad input, load reports, metrics."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry, generate_latest

from llm_common.errors import parse_error
from llm_inference.config import EngineSettings, Limits, Settings
from llm_inference.metrics import InferenceMetrics
from llm_inference.server import SERVICE_NAME, load_service
from llm_testing import RunningServer, running_server, settings_for_tests
from llmapi.common.v1 import common_pb2
from llmapi.inference.v1 import inference_service_pb2 as pb
from llmapi.inference.v1 import inference_service_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

MIB = 1 << 20
# 4 MiB of KV at 4 KiB per token (4 layers x 4 KV heads x 32 dims x K,V x fp32): 64 blocks of 16.
ENGINE = EngineSettings(device="cpu", dtype="float32", kv_cache_bytes=4 * MIB, max_num_seqs=8,
                        max_batched_tokens=256)  # fmt: skip
PROMPT = [0, 17, 240, 1033, 77, 512, 9, 3001]


@pytest.fixture(scope="module")
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture(scope="module")
def settings(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    models = tmp_path_factory.mktemp("catalog") / "models.yaml"
    models.write_text(
        "models:\n  - name: demo-llama\n    aliases: [demo]\n"
        f"    checkpoint: {demo_model_dir}\n    context_length: 2048\n"
        "    default_max_tokens: 32\n",
        encoding="utf-8",
    )
    return Settings(
        server=settings_for_tests("inference"),
        model="demo",
        models_config=models,
        model_root=models.parent,
        replica_id="replica-a",
        engine=ENGINE,
        limits=Limits(),
    )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(settings: Settings, registry: CollectorRegistry) -> AsyncIterator[RunningServer]:
    loaded = await load_service(settings, InferenceMetrics("demo-llama", registry))
    async with running_server(loaded.spec, settings=settings.server) as running:
        yield running


@pytest.fixture
def stub(server: RunningServer) -> pb_grpc.InferenceServiceAsyncStub:
    return pb_grpc.InferenceServiceStub(server.channel)


def generate_request(request_id: str = "req-1", **sampling: Any) -> pb.GenerateRequest:
    prompt = sampling.pop("prompt", PROMPT)
    detokenize = sampling.pop("detokenize", False)
    delivery = sampling.pop("delivery", None)
    return pb.GenerateRequest(
        request_id=request_id,
        prompt_token_ids=prompt,
        sampling=common_pb2.SamplingParams(**sampling),
        detokenize=detokenize,
        delivery=delivery,
    )


async def generate(
    stub: pb_grpc.InferenceServiceAsyncStub, request: pb.GenerateRequest
) -> list[Any]:
    return [message async for message in stub.Generate(request, timeout=60)]


async def wait_until(predicate: Callable[[], Any], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def load(stub: pb_grpc.InferenceServiceAsyncStub) -> pb.LoadReport:
    return (await stub.GetLoad(pb.GetLoadRequest(), timeout=5)).load


async def idle(stub: pb_grpc.InferenceServiceAsyncStub) -> None:
    """Wait until nothing runs and every KV block is free again."""

    async def check() -> bool:
        report = await load(stub)
        info = await stub.Info(pb.InfoRequest(), timeout=5)
        return report.num_running == 0 and report.kv_cache_usage == 0 and info.kv_blocks_total > 0

    await wait_until(check)


async def test_health_is_serving(server: RunningServer) -> None:
    health = health_pb2_grpc.HealthStub(server.channel)
    for service in ("", SERVICE_NAME):
        reply = await health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_info(stub: pb_grpc.InferenceServiceAsyncStub) -> None:
    info = await stub.Info(pb.InfoRequest(), timeout=5)
    assert (info.model, info.kind) == ("demo-llama", common_pb2.MODEL_KIND_GENERATION)
    assert (info.backend, info.dtype, info.device) == ("torch", "float32", "cpu")
    assert (info.kv_block_size, info.kv_blocks_total) == (16, 64)
    # The KV budget (64 blocks x 16 tokens) caps the catalogue's 2048-token context.
    assert info.max_context == 1024
    assert (info.max_num_seqs, info.max_batched_tokens) == (8, 256)
    assert info.replica_id == "replica-a"


async def test_streams_tokens_then_usage_and_timings(
    stub: pb_grpc.InferenceServiceAsyncStub,
) -> None:
    request = generate_request(
        temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=True, detokenize=True
    )
    messages = await generate(stub, request)
    assert len(messages) >= 2  # streamed, not one final blob
    tokens = [t for m in messages for t in m.token_ids]
    assert len(tokens) == 10
    assert all(m.finish_reason == common_pb2.FINISH_REASON_UNSPECIFIED for m in messages[:-1])
    assert all(not m.HasField("usage") for m in messages[:-1])
    last = messages[-1]
    assert last.finish_reason == common_pb2.FINISH_REASON_LENGTH
    assert last.usage == common_pb2.Usage(
        prompt_tokens=len(PROMPT), completion_tokens=10, total_tokens=len(PROMPT) + 10,
        cached_tokens=last.usage.cached_tokens,
    )  # fmt: skip
    assert last.timings.ttft_ms > 0
    assert last.timings.prefill_ms > 0
    assert last.timings.ttft_ms >= last.timings.queue_ms
    logprobs = [lp for m in messages for lp in m.logprobs]
    assert [lp.token_id for lp in logprobs] == tokens
    assert all(lp.logprob <= 0 for lp in logprobs)
    assert "".join(m.text_delta for m in messages)


async def test_text_is_omitted_unless_asked_for(stub: pb_grpc.InferenceServiceAsyncStub) -> None:
    messages = await generate(
        stub, generate_request(temperature=0.0, max_tokens=4, ignore_eos=True)
    )
    assert all(m.text_delta == "" for m in messages)


async def test_default_max_tokens_comes_from_the_catalogue(
    stub: pb_grpc.InferenceServiceAsyncStub,
) -> None:
    messages = await generate(stub, generate_request(temperature=0.0, ignore_eos=True))
    assert messages[-1].usage.completion_tokens == 32


async def test_greedy_output_equals_the_cli(
    stub: pb_grpc.InferenceServiceAsyncStub, demo_model_dir: Path
) -> None:
    messages = await generate(
        stub, generate_request(temperature=0.0, max_tokens=12, ignore_eos=True)
    )
    served = [t for m in messages for t in m.token_ids]
    command = [
        sys.executable, "-m", "llm_inference", "generate", "--model", str(demo_model_dir),
        "--prompt-token-ids", ",".join(map(str, PROMPT)), "--max-tokens", "12", "--ignore-eos",
    ]  # fmt: skip
    env = {**os.environ, "INFERENCE_DEVICE": "cpu", "INFERENCE_KV_CACHE_BYTES": str(4 * MIB)}
    result = await asyncio.to_thread(
        subprocess.run, command, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    assert printed["token_ids"] == served
    assert printed["finish_reason"] == "length"
    assert printed["usage"]["prompt_tokens"] == len(PROMPT)


async def test_seeded_sampling_is_reproducible(stub: pb_grpc.InferenceServiceAsyncStub) -> None:
    request = generate_request(temperature=0.9, top_k=50, seed=1234, max_tokens=8, ignore_eos=True)
    first, second = await asyncio.gather(generate(stub, request), generate(stub, request))
    assert [list(m.token_ids) for m in first] != []
    assert [t for m in first for t in m.token_ids] == [t for m in second for t in m.token_ids]


async def test_cancel_mid_stream_frees_blocks(stub: pb_grpc.InferenceServiceAsyncStub) -> None:
    await idle(stub)
    call = stub.Generate(
        generate_request("cancel-me", temperature=0.0, max_tokens=900, ignore_eos=True,
                         prompt=list(range(3, 100))),
    )  # fmt: skip
    first = await call.read()
    assert first.token_ids
    busy = await load(stub)
    assert busy.num_running == 1
    assert busy.kv_cache_usage > 0
    assert busy.running_remaining_tokens > 0
    assert call.cancel()
    await idle(stub)
    assert await call.code() == grpc.StatusCode.CANCELLED


async def test_grouped_delivery_sends_the_same_tokens_in_fewer_messages(
    stub: pb_grpc.InferenceServiceAsyncStub,
) -> None:
    settings = {"temperature": 0.0, "max_tokens": 17, "ignore_eos": True, "detokenize": True}
    each = await generate(stub, generate_request("each", **settings))
    four = pb.Delivery(max_tokens_per_message=4)
    request = generate_request("grouped", delivery=four, **settings)
    grouped = await generate(stub, request)
    assert [t for m in grouped for t in m.token_ids] == [t for m in each for t in m.token_ids]
    assert "".join(m.text_delta for m in grouped) == "".join(m.text_delta for m in each)
    assert len(grouped[0].token_ids) == 1  # the first token is not held
    # No hold time: every message but the first and the last is full.
    assert [len(m.token_ids) for m in grouped[1:-1]] == [4] * (len(grouped) - 2)
    assert len(grouped) <= 2 + 16 // 4
    assert grouped[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
    assert grouped[-1].usage.completion_tokens == 17


async def test_stop_ends_the_stream_with_what_it_held_and_the_exact_count(
    stub: pb_grpc.InferenceServiceAsyncStub,
) -> None:
    await idle(stub)
    request = generate_request(
        "stop-me", temperature=0.0, max_tokens=900, ignore_eos=True, prompt=list(range(3, 100)),
        delivery=pb.Delivery(max_tokens_per_message=1000),
    )  # fmt: skip
    call = stub.Generate(request, timeout=60)
    first = await call.read()
    assert len(first.token_ids) == 1
    await wait_until(lambda: _generated_beyond(stub, 5))  # tokens are being held
    reply = await stub.Stop(pb.StopRequest(request_id="stop-me"), timeout=5)
    assert reply.stopped == 1
    rest = []
    while (message := await call.read()) is not grpc.aio.EOF:
        rest.append(message)
    last = rest[-1]
    assert last.finish_reason == common_pb2.FINISH_REASON_CANCELLED
    received = len(first.token_ids) + sum(len(m.token_ids) for m in rest)
    assert received > 5  # the held tokens came with the last message
    assert last.usage.completion_tokens == received
    assert await call.code() == grpc.StatusCode.OK
    await idle(stub)
    again = await stub.Stop(pb.StopRequest(request_id="stop-me"), timeout=5)
    assert again.stopped == 0


async def _generated_beyond(stub: pb_grpc.InferenceServiceAsyncStub, tokens: int) -> bool:
    report = await load(stub)
    return report.num_running == 1 and report.running_remaining_tokens < 900 - tokens


async def test_stop_validates_the_request_id(stub: pb_grpc.InferenceServiceAsyncStub) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Stop(pb.StopRequest(request_id="no spaces"), timeout=5)
    details = parse_error(err.value)
    assert details.code == grpc.StatusCode.INVALID_ARGUMENT
    assert [v.field for v in details.field_violations] == ["request_id"]


async def test_short_deadline_aborts_the_request(stub: pb_grpc.InferenceServiceAsyncStub) -> None:
    await idle(stub)
    request = generate_request("deadline", temperature=0.0, max_tokens=900, ignore_eos=True)
    received: list[Any] = []

    async def consume() -> None:
        async for message in stub.Generate(request, timeout=0.5):
            received.append(message)

    with pytest.raises(grpc.aio.AioRpcError) as err:
        await consume()
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert received  # it was streaming when the deadline hit
    await idle(stub)


BAD_REQUESTS = [
    (generate_request(prompt=[]), "prompt_token_ids"),
    (generate_request(prompt=[5] * 1024), "prompt_token_ids"),
    (generate_request(prompt=[1, 2, 4096]), "prompt_token_ids[2]"),
    (generate_request(prompt=[-3]), "prompt_token_ids[0]"),
    (generate_request(request_id=""), "request_id"),
    (generate_request(temperature=2.5), "sampling.temperature"),
    (generate_request(temperature=float("nan")), "sampling.temperature"),
    (generate_request(top_p=0.0), "sampling.top_p"),
    (generate_request(top_p=1.5), "sampling.top_p"),
    (generate_request(top_k=-1), "sampling.top_k"),
    (generate_request(max_tokens=0), "sampling.max_tokens"),
    (generate_request(max_tokens=1020), "sampling.max_tokens"),
    (generate_request(stop=["s"] * 17), "sampling.stop"),
    (generate_request(stop=["x" * 257]), "sampling.stop[0]"),
    (generate_request(stop=[""]), "sampling.stop[0]"),
    (generate_request(stop_token_ids=[4096]), "sampling.stop_token_ids[0]"),
    (generate_request(stop_token_ids=list(range(65))), "sampling.stop_token_ids"),
    (generate_request(delivery=pb.Delivery(max_tokens_per_message=-1)),
     "delivery.max_tokens_per_message"),
    (generate_request(delivery=pb.Delivery(max_tokens_per_message=4097)),
     "delivery.max_tokens_per_message"),
    (generate_request(delivery=pb.Delivery(max_hold_ms=-5)), "delivery.max_hold_ms"),
    (generate_request(delivery=pb.Delivery(max_hold_ms=60_001)), "delivery.max_hold_ms"),
]  # fmt: skip


@pytest.mark.parametrize(("request_", "field"), BAD_REQUESTS)
async def test_bad_input_is_invalid_argument_with_the_field(
    stub: pb_grpc.InferenceServiceAsyncStub, request_: pb.GenerateRequest, field: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await generate(stub, request_)
    details = parse_error(err.value)
    assert details.code == grpc.StatusCode.INVALID_ARGUMENT
    assert [v.field for v in details.field_violations] == [field]
    assert details.field_violations[0].description


async def test_keeps_serving_after_bad_input(
    stub: pb_grpc.InferenceServiceAsyncStub, server: RunningServer
) -> None:
    for request, _ in BAD_REQUESTS[:4]:
        with pytest.raises(grpc.aio.AioRpcError):
            await generate(stub, request)
    messages = await generate(
        stub, generate_request(temperature=0.0, max_tokens=3, ignore_eos=True)
    )
    assert messages[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
    health = health_pb2_grpc.HealthStub(server.channel)
    reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_embed_needs_an_embedding_deployment(stub: pb_grpc.InferenceServiceAsyncStub) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Embed(pb.EmbedRequest(inputs=["hello"]), timeout=5)
    details = parse_error(err.value)
    assert details.code == grpc.StatusCode.FAILED_PRECONDITION
    assert [(v.type, v.subject) for v in details.precondition_violations] == [
        ("MODEL_KIND", "demo-llama")
    ]


async def test_watch_load_streams_reports(stub: pb_grpc.InferenceServiceAsyncStub) -> None:
    call = stub.WatchLoad(pb.WatchLoadRequest(interval_ms=50), timeout=10)
    reports = []
    async for message in call:
        reports.append(message.load)
        if len(reports) == 3:
            break
    call.cancel()
    assert all(r.replica_id == "replica-a" and r.max_num_seqs == 8 for r in reports)
    stamps = [r.observed_at.ToNanoseconds() for r in reports]
    assert stamps == sorted(stamps)
    assert stamps[-1] - stamps[0] >= 90_000_000  # two 50 ms intervals
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in stub.WatchLoad(pb.WatchLoadRequest(interval_ms=10), timeout=5):
            pass
    details = parse_error(err.value)
    assert details.code == grpc.StatusCode.INVALID_ARGUMENT
    assert [v.field for v in details.field_violations] == ["interval_ms"]


async def test_metrics_expose_vllm_gauges_and_request_histograms(
    stub: pb_grpc.InferenceServiceAsyncStub, registry: CollectorRegistry
) -> None:
    await generate(stub, generate_request(temperature=0.0, max_tokens=3, ignore_eos=True))
    text = generate_latest(registry).decode()
    for name in ("vllm:num_requests_waiting", "vllm:num_requests_running",
                 "vllm:kv_cache_usage_perc"):  # fmt: skip
        assert f'\n{name}{{model_name="demo-llama"}} ' in text
    assert 'llm_inference_kv_blocks_capacity{model_name="demo-llama"} 64.0' in text
    count = 'llm_inference_time_to_first_token_seconds_count{model_name="demo-llama"}'
    assert float(text.split(count)[1].split()[0]) >= 1
    cancelled = 'llm_inference_requests_total{finish_reason="cancelled",model_name="demo-llama"}'
    assert cancelled in text  # from the cancel and deadline tests
