"""sampling.format through the real InferenceService (grpc.aio on port 0, the torch engine on the
demo checkpoint): constrained output, and bad formats as INVALID_ARGUMENT naming the field."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
from prometheus_client import REGISTRY

from llm_common.errors import ErrorDetails, parse_error
from llm_inference.config import EngineSettings, Limits, Settings
from llm_inference.server import load_service
from llm_testing import RunningServer, running_server, settings_for_tests
from llmapi.common.v1 import common_pb2
from llmapi.inference.v1 import inference_service_pb2 as pb
from llmapi.inference.v1 import inference_service_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

ENGINE = EngineSettings(device="cpu", dtype="float32", kv_cache_bytes=4 << 20, max_num_seqs=8,
                        max_batched_tokens=256)  # fmt: skip
PROMPT = [0, 17, 240, 1033, 77, 512, 9, 3001]
SCHEMA = {
    "type": "object",
    "properties": {
        "color": {"enum": ["red", "green"]},
        "n": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["color", "n"],
}


@pytest.fixture(scope="module")
def settings(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    models = tmp_path_factory.mktemp("catalog") / "models.yaml"
    models.write_text(
        "models:\n  - name: demo-llama\n"
        f"    checkpoint: {demo_model_dir}\n    context_length: 2048\n"
        "    default_max_tokens: 64\n",
        encoding="utf-8",
    )
    return Settings(
        server=settings_for_tests("inference"),
        model="demo-llama",
        models_config=models,
        model_root=models.parent,
        replica_id="replica-f",
        engine=ENGINE,
        limits=Limits(),
    )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(settings: Settings) -> AsyncIterator[RunningServer]:
    loaded = await load_service(settings)
    async with running_server(loaded.spec, settings=settings.server) as running:
        yield running


@pytest.fixture
def stub(server: RunningServer) -> pb_grpc.InferenceServiceAsyncStub:
    return pb_grpc.InferenceServiceStub(server.channel)


def request(request_id: str, fmt: common_pb2.OutputFormat, **sampling: Any) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id=request_id,
        prompt_token_ids=PROMPT,
        sampling=common_pb2.SamplingParams(format=fmt, **sampling),
        detokenize=True,
    )


async def generate(stub: pb_grpc.InferenceServiceAsyncStub, req: pb.GenerateRequest) -> list[Any]:
    return [message async for message in stub.Generate(req, timeout=60)]


async def rejected(
    stub: pb_grpc.InferenceServiceAsyncStub, req: pb.GenerateRequest
) -> ErrorDetails:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await generate(stub, req)
    details = parse_error(caught.value)
    assert details.code == grpc.StatusCode.INVALID_ARGUMENT
    return details


async def test_json_schema_output_parses(stub: pb_grpc.InferenceServiceAsyncStub) -> None:
    fmt = common_pb2.OutputFormat(json_schema=json.dumps(SCHEMA))
    messages = await generate(stub, request("ok-1", fmt, temperature=0.0))
    last = messages[-1]
    assert last.finish_reason == common_pb2.FINISH_REASON_STOP
    value = json.loads("".join(m.text_delta for m in messages))
    assert value["color"] in ("red", "green")
    assert 0 <= value["n"] <= 9


async def test_grammar_counters_are_exported(stub: pb_grpc.InferenceServiceAsyncStub) -> None:
    fmt = common_pb2.OutputFormat(json_schema=json.dumps(SCHEMA))
    for attempt in range(2):  # the second compile of the same schema is a cache hit
        await generate(stub, request(f"metrics-{attempt}", fmt, temperature=0.0))
    labels = {"model_name": "demo-llama"}
    sample = REGISTRY.get_sample_value
    assert (sample("llm_inference_grammar_compiles_total", {**labels, "result": "hit"}) or 0) >= 1
    assert (sample("llm_inference_grammar_masked_rows_total", labels) or 0) > 0
    assert sample("llm_inference_grammar_mask_ms", {**labels, "quantile": "0.99"}) is not None


async def test_unsupported_schema_is_invalid_argument_and_serving_goes_on(
    stub: pb_grpc.InferenceServiceAsyncStub,
) -> None:
    schema = {"type": "object", "properties": {"a": {"not": {"type": "string"}}}}
    fmt = common_pb2.OutputFormat(json_schema=json.dumps(schema))
    details = await rejected(stub, request("bad-1", fmt))
    [violation] = details.field_violations
    assert violation.field == "sampling.format.json_schema"
    assert violation.description.startswith('unsupported keyword "not" at $.properties.a')
    choice = common_pb2.OutputFormat(choice=common_pb2.ChoiceFormat(values=["up", "down"]))
    messages = await generate(stub, request("ok-2", choice, temperature=1.0, seed=3))
    assert "".join(m.text_delta for m in messages) in ("up", "down")
    assert messages[-1].finish_reason == common_pb2.FINISH_REASON_STOP


@pytest.mark.parametrize(
    ("fmt", "extra", "field"),
    [
        (common_pb2.OutputFormat(regex="(a"), {}, "sampling.format.regex"),
        (common_pb2.OutputFormat(grammar='root ::= "a'), {}, "sampling.format.grammar"),
        (common_pb2.OutputFormat(json_schema="{"), {}, "sampling.format.json_schema"),
        (
            common_pb2.OutputFormat(choice=common_pb2.ChoiceFormat(values=["x"] * 257)),
            {},
            "sampling.format.choice.values",
        ),
        (
            common_pb2.OutputFormat(tagged_json=common_pb2.TaggedJsonFormat(max_items=65)),
            {},
            "sampling.format.tagged_json.max_items",
        ),
        (common_pb2.OutputFormat(json_object=True), {"ignore_eos": True}, "sampling.ignore_eos"),
        (common_pb2.OutputFormat(), {}, "sampling.format"),
    ],
)
async def test_bad_formats_name_their_field(
    stub: pb_grpc.InferenceServiceAsyncStub,
    fmt: common_pb2.OutputFormat,
    extra: dict[str, Any],
    field: str,
) -> None:
    details = await rejected(stub, request("bad-2", fmt, **extra))
    assert [v.field for v in details.field_violations] == [field]
