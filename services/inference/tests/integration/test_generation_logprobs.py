"""Logprobs through a real InferenceService (grpc.aio, port 0, the PyTorch engine on the demo
checkpoint): top_logprobs alternatives with text and raw bytes, and the sampling surface's
violations."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry

from llm_common.errors import parse_error
from llm_inference.config import EngineSettings, Limits, Settings
from llm_inference.metrics import InferenceMetrics
from llm_inference.server import load_service
from llm_testing import RunningServer, running_server, settings_for_tests
from llmapi.common.v1 import common_pb2
from llmapi.inference.v1 import inference_service_pb2 as pb
from llmapi.inference.v1 import inference_service_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

ENGINE = EngineSettings(device="cpu", dtype="float32", kv_cache_bytes=4 << 20, max_num_seqs=4,
                        max_batched_tokens=256)  # fmt: skip
PROMPT = [0, 17, 240, 1033, 77, 512, 9, 3001]
SPECIAL_IDS = range(6)  # <|bos|>, <|eos|>, <|pad|> and the chat markers


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(
    demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[RunningServer]:
    models = tmp_path_factory.mktemp("catalog") / "models.yaml"
    models.write_text(
        f"models:\n  - name: demo-llama\n    checkpoint: {demo_model_dir}\n"
        "    context_length: 2048\n    default_max_tokens: 32\n",
        encoding="utf-8",
    )
    settings = Settings(
        server=settings_for_tests("inference"), model="demo-llama", models_config=models,
        model_root=models.parent, replica_id="replica-a", engine=ENGINE, limits=Limits(),
    )  # fmt: skip
    loaded = await load_service(settings, InferenceMetrics("demo-llama", CollectorRegistry()))
    async with running_server(loaded.spec, settings=settings.server) as running:
        yield running


@pytest.fixture
def stub(server: RunningServer) -> pb_grpc.InferenceServiceAsyncStub:
    return pb_grpc.InferenceServiceStub(server.channel)


async def generate(stub: pb_grpc.InferenceServiceAsyncStub, **sampling: Any) -> list[Any]:
    request = pb.GenerateRequest(
        request_id="lp-1",
        prompt_token_ids=PROMPT,
        sampling=common_pb2.SamplingParams(**sampling),
        detokenize=True,
    )
    return [message async for message in stub.Generate(request, timeout=60)]


async def test_top_logprobs_give_five_alternatives_with_bytes(
    stub: pb_grpc.InferenceServiceAsyncStub,
) -> None:
    # Specials are banned so that the chosen tokens' bytes are exactly the streamed text.
    messages = await generate(
        stub, temperature=0.0, max_tokens=16, ignore_eos=True, top_logprobs=5,
        logit_bias={i: -100.0 for i in SPECIAL_IDS},
    )  # fmt: skip
    entries = [lp for m in messages for lp in m.logprobs]
    assert [lp.token_id for lp in entries] == [t for m in messages for t in m.token_ids]
    assert len(entries) == 16
    for entry in entries:
        assert entry.bytes
        assert entry.token == entry.bytes.decode("utf-8", errors="replace")
        top = entry.top_logprobs
        assert len(top) == 5
        assert all(alt.bytes and alt.token for alt in top)
        assert [alt.logprob for alt in top] == sorted((alt.logprob for alt in top), reverse=True)
        assert (top[0].token_id, top[0].logprob) == (entry.token_id, entry.logprob)  # greedy
        assert not set(SPECIAL_IDS) & {alt.token_id for alt in top}
    text = "".join(m.text_delta for m in messages)
    assert b"".join(lp.bytes for lp in entries) == text.encode("utf-8")


async def test_sampled_tokens_logprob_matches_its_alternative(
    stub: pb_grpc.InferenceServiceAsyncStub,
) -> None:
    messages = await generate(
        stub, temperature=0.8, seed=5, max_tokens=12, ignore_eos=True, top_logprobs=20,
        top_k=10, frequency_penalty=0.5, min_p=0.01,
    )  # fmt: skip
    for entry in (lp for m in messages for lp in m.logprobs):
        alternatives = {alt.token_id: alt.logprob for alt in entry.top_logprobs}
        assert 1 <= len(alternatives) <= 10  # top_k leaves at most 10 possible tokens
        assert alternatives[entry.token_id] == pytest.approx(entry.logprob)


@pytest.mark.parametrize(
    ("sampling", "field"),
    [
        ({"n": 2}, "sampling.n"),
        ({"top_logprobs": 21}, "sampling.top_logprobs"),
        ({"repetition_penalty": 0.0}, "sampling.repetition_penalty"),
        ({"logit_bias": {4096: 1.0}}, "sampling.logit_bias[4096]"),
        ({"min_tokens": 40, "max_tokens": 10}, "sampling.min_tokens"),
        ({"min_p": 1.5}, "sampling.min_p"),
    ],
)
async def test_bad_sampling_is_invalid_argument_naming_the_field(
    stub: pb_grpc.InferenceServiceAsyncStub, sampling: dict[str, Any], field: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await generate(stub, **sampling)
    details = parse_error(err.value)
    assert details.code == grpc.StatusCode.INVALID_ARGUMENT
    assert [v.field for v in details.field_violations] == [field]
