"""Resume (mid-stream migration) on a real server with the demo checkpoint: a request resumed
with the tokens and text an earlier replica delivered continues token- and text-identically to
the unbroken run (greedy, seeded with penalties, stop strings held back across the cut)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
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

ENGINE = EngineSettings(device="cpu", dtype="float32", kv_cache_bytes=4 << 20, max_num_seqs=8,
                        max_batched_tokens=256)  # fmt: skip
PROMPT = [0, 17, 240, 1033, 77, 512, 9, 3001]


@dataclass(frozen=True, slots=True)
class Run:
    """One streamed answer: per message, its tokens and text."""

    tokens: list[list[int]]
    texts: list[str]
    finish: int
    completion_tokens: int

    @property
    def ids(self) -> list[int]:
        return [t for m in self.tokens for t in m]

    @property
    def text(self) -> str:
        return "".join(self.texts)

    def delivered(self, messages: int) -> tuple[list[int], int]:
        """The tokens and text length a caller had after `messages` messages."""
        ids = [t for m in self.tokens[:messages] for t in m]
        return ids, sum(len(t) for t in self.texts[:messages])


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stub(
    demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[pb_grpc.InferenceServiceAsyncStub]:
    models = tmp_path_factory.mktemp("catalog") / "models.yaml"
    models.write_text(
        f"models:\n  - name: demo-llama\n    checkpoint: {demo_model_dir}\n"
        "    context_length: 2048\n    default_max_tokens: 32\n",
        encoding="utf-8",
    )
    settings = Settings(
        server=settings_for_tests("inference"), model="demo-llama", models_config=models,
        model_root=models.parent, replica_id="resume", engine=ENGINE, limits=Limits(),
    )  # fmt: skip
    loaded = await load_service(settings, InferenceMetrics("demo-llama", CollectorRegistry()))
    running: RunningServer
    async with running_server(loaded.spec, settings=settings.server) as running:
        yield pb_grpc.InferenceServiceStub(running.channel)


async def run(
    stub: pb_grpc.InferenceServiceAsyncStub,
    sampling: common_pb2.SamplingParams,
    resume: pb.Resume | None = None,
) -> Run:
    request = pb.GenerateRequest(
        request_id="resume-test", prompt_token_ids=PROMPT, sampling=sampling,
        detokenize=True, resume=resume,
    )  # fmt: skip
    messages = [m async for m in stub.Generate(request, timeout=60)]
    last = messages[-1]
    return Run(
        [list(m.token_ids) for m in messages],
        [m.text_delta for m in messages],
        last.finish_reason,
        last.usage.completion_tokens,
    )


async def assert_resumes_identically(
    stub: pb_grpc.InferenceServiceAsyncStub, sampling: common_pb2.SamplingParams
) -> Run:
    whole = await run(stub, sampling)
    assert len(whole.tokens) > 6
    for cut in (1, 3, len(whole.tokens) // 2, len(whole.tokens) - 2):
        ids, chars = whole.delivered(cut)
        rest = await run(stub, sampling, pb.Resume(token_ids=ids, text_sent_chars=chars))
        assert ids + rest.ids == whole.ids, f"cut after {cut} messages"
        assert whole.text[:chars] + rest.text == whole.text, f"cut after {cut} messages"
        assert (rest.finish, rest.completion_tokens) == (whole.finish, whole.completion_tokens)
    return whole


async def test_greedy_resume_is_token_identical(stub: pb_grpc.InferenceServiceAsyncStub) -> None:
    await assert_resumes_identically(
        stub, common_pb2.SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    )


async def test_seeded_resume_with_penalties_is_token_identical(
    stub: pb_grpc.InferenceServiceAsyncStub,
) -> None:
    sampling = common_pb2.SamplingParams(
        temperature=1.1, top_k=40, seed=2024, max_tokens=24, ignore_eos=True,
        frequency_penalty=0.8, presence_penalty=0.3, min_tokens=20,
    )  # fmt: skip
    whole = await assert_resumes_identically(stub, sampling)
    other = await run(stub, common_pb2.SamplingParams(temperature=1.1, top_k=40, seed=7,
                                                       max_tokens=24, ignore_eos=True))  # fmt: skip
    assert other.ids != whole.ids  # the seed matters: the check above can fail


async def test_text_held_for_a_stop_string_is_sent_after_the_cut(
    stub: pb_grpc.InferenceServiceAsyncStub,
) -> None:
    free = await run(stub, common_pb2.SamplingParams(temperature=0.0, max_tokens=40,
                                                      ignore_eos=True))  # fmt: skip
    stop = free.text[len(free.text) * 2 // 3 :][:6]  # a stop string that occurs late
    assert len(stop) == 6
    sampling = common_pb2.SamplingParams(
        temperature=0.0, max_tokens=40, ignore_eos=True, stop=[stop, "\x00never"]
    )
    whole = await assert_resumes_identically(stub, sampling)
    assert whole.finish == common_pb2.FINISH_REASON_STOP
    assert stop not in whole.text
    assert "" in whole.texts[:-1]  # a token's text was held back: cuts there test the hold


async def test_invalid_resume_is_invalid_argument(stub: pb_grpc.InferenceServiceAsyncStub) -> None:
    sampling = common_pb2.SamplingParams(temperature=0.0, max_tokens=4)
    cases: list[tuple[pb.Resume, str]] = [
        (pb.Resume(token_ids=[1, 2, 3, 4]), "resume.token_ids"),
        (pb.Resume(token_ids=[1, 10**8]), "resume.token_ids[1]"),
        (pb.Resume(token_ids=[1], text_sent_chars=-1), "resume.text_sent_chars"),
    ]
    for resume, field in cases:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await run(stub, sampling, resume)
        err: Any = caught.value
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        fields = [v.field for v in parse_error(err).field_violations]
        assert field in fields, fields
