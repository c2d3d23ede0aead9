"""Settings from environment dicts, and deployment resolution against a temporary models.yaml."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from llm_common.config import MIB, ConfigError
from llm_inference.config import (
    DEFAULT_GRPC_PORT,
    DEFAULT_METRICS_PORT,
    EngineSettings,
    Limits,
    Settings,
)
from llm_inference.deployment import (
    EMBEDDING,
    GENERATION,
    checkpoint_context,
    model_facts,
    resolve_deployment,
)

WriteModels = Callable[[list[dict[str, object]]], Path]


def test_defaults() -> None:
    settings = Settings.from_env({})
    assert settings.server.grpc_port == DEFAULT_GRPC_PORT == 50054
    assert settings.server.metrics_port == DEFAULT_METRICS_PORT == 9154
    assert settings.model == "default"
    assert settings.models_config == Path("infra/config/models.yaml")
    assert settings.checkpoint is None
    assert settings.replica_id.endswith(":50054")
    assert settings.engine == EngineSettings()
    assert settings.engine.backend == "torch"
    assert settings.limits == Limits()


def test_every_variable_is_read() -> None:
    env = {
        "GRPC_PORT": "6000",
        "METRICS_PORT": "off",
        "INFERENCE_MODEL": "demo-llama",
        "MODELS_CONFIG": "/etc/llmapi/models.yaml",
        "MODEL_ROOT": "/models",
        "INFERENCE_CHECKPOINT": "/models/custom",
        "REPLICA_ID": "pod-7",
        "INFERENCE_BACKEND": "TensorRT_LLM",
        "INFERENCE_DEVICE": "cuda",
        "INFERENCE_DTYPE": "bfloat16",
        "INFERENCE_KV_CACHE_BYTES": str(64 * MIB),
        "INFERENCE_GPU_MEMORY_FRACTION": "0.5",
        "INFERENCE_MAX_NUM_SEQS": "8",
        "INFERENCE_MAX_BATCHED_TOKENS": "512",
        "INFERENCE_KV_BLOCK_SIZE": "32",
        "INFERENCE_PREFIX_CACHING": "off",
        "INFERENCE_TENSOR_PARALLEL_SIZE": "2",
        "INFERENCE_PIPELINE_PARALLEL_SIZE": "2",
        "INFERENCE_SEED": "7",
        "INFERENCE_CONSTRAINED_DECODING": "false",
        "INFERENCE_SPECULATIVE_TOKENS": "3",
        "INFERENCE_CUDA_GRAPHS": "off",
        "INFERENCE_MAX_STOP_STRINGS": "4",
        "INFERENCE_MAX_EMBED_INPUTS": "8",
        "INFERENCE_EMBED_BATCH_SIZE": "4",
    }
    settings = Settings.from_env(env)
    assert settings.server.grpc_port == 6000
    assert settings.server.metrics_port is None
    assert settings.model == "demo-llama"
    assert settings.models_config == Path("/etc/llmapi/models.yaml")
    assert settings.model_root == Path("/models")
    assert settings.checkpoint == Path("/models/custom")
    assert settings.replica_id == "pod-7"
    assert settings.engine == EngineSettings(
        backend="tensorrt_llm",
        device="cuda",
        dtype="bfloat16",
        kv_cache_bytes=64 * MIB,
        gpu_memory_fraction=0.5,
        max_num_seqs=8,
        max_batched_tokens=512,
        kv_block_size=32,
        prefix_caching=False,
        tensor_parallel_size=2,
        pipeline_parallel_size=2,
        seed=7,
        constrained_decoding=False,
        speculative_tokens=3,
        cuda_graphs=False,
    )
    assert settings.limits.max_stop_strings == 4
    assert settings.limits.max_embed_inputs == 8
    assert settings.limits.embed_batch_size == 4


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"INFERENCE_BACKEND": "vllm"}, "INFERENCE_BACKEND"),
        ({"INFERENCE_DEVICE": "tpu"}, "INFERENCE_DEVICE"),
        ({"INFERENCE_DTYPE": "int4"}, "INFERENCE_DTYPE"),
        ({"INFERENCE_QUANTIZATION": "fp8"}, "INFERENCE_QUANTIZATION"),
        ({"INFERENCE_MAX_NUM_SEQS": "0"}, "INFERENCE_MAX_NUM_SEQS"),
        ({"INFERENCE_KV_BLOCK_SIZE": "x"}, "INFERENCE_KV_BLOCK_SIZE"),
        ({"INFERENCE_PREFIX_CACHING": "maybe"}, "INFERENCE_PREFIX_CACHING"),
        ({"INFERENCE_GPU_MEMORY_FRACTION": "1.5"}, "INFERENCE_GPU_MEMORY_FRACTION"),
        ({"INFERENCE_MAX_EMBED_INPUTS": "0"}, "INFERENCE_MAX_EMBED_INPUTS"),
        ({"GRPC_PORT": "70000"}, "GRPC_PORT"),
        (
            {"INFERENCE_BACKEND": "tensorrt_llm", "INFERENCE_QUANTIZATION": "int8"},
            "INFERENCE_QUANTIZATION",
        ),
    ],
)
def test_invalid_values_name_the_variable(env: dict[str, str], variable: str) -> None:
    with pytest.raises(ConfigError) as err:
        Settings.from_env(env)
    assert str(err.value).startswith(variable)


def _settings(models: Path, model: str, **kwargs: object) -> Settings:
    env = {"MODELS_CONFIG": str(models), "MODEL_ROOT": str(models.parent), "INFERENCE_MODEL": model}
    env.update({k: str(v) for k, v in kwargs.items()})
    return Settings.from_env(env)


def _checkpoint(directory: Path, **config: object) -> Path:
    directory.mkdir()
    body = ", ".join(f'"{k}": {v}' for k, v in config.items())
    (directory / "config.json").write_text("{" + body + "}", encoding="utf-8")
    return directory


def test_resolves_generation_and_embedding_models(tmp_path: Path, models_yaml: WriteModels) -> None:
    _checkpoint(tmp_path / "gen", vocab_size=100, max_position_embeddings=512)
    _checkpoint(tmp_path / "enc", vocab_size=30522)
    models = models_yaml(
        [
            {"name": "gen", "aliases": ["g"], "checkpoint": "gen", "context_length": 1024,
             "default_max_tokens": 600},
            {"name": "enc", "kind": "embedding", "checkpoint": str(tmp_path / "enc")},
        ]
    )  # fmt: skip
    gen = resolve_deployment(_settings(models, "g"))
    assert (gen.name, gen.kind, gen.checkpoint) == ("gen", GENERATION, tmp_path / "gen")
    # The checkpoint's 512 positions cap the catalogue's 1024; the default follows.
    limit = checkpoint_context(gen.checkpoint, gen.context_length)
    assert limit == 512
    facts = model_facts(gen, limit)
    assert (facts.vocab_size, facts.max_context, facts.default_max_tokens) == (100, 512, 511)
    enc = resolve_deployment(_settings(models, "enc"))
    assert (enc.kind, enc.checkpoint) == (EMBEDDING, tmp_path / "enc")


def test_checkpoint_override(tmp_path: Path, models_yaml: WriteModels) -> None:
    override = _checkpoint(tmp_path / "elsewhere", vocab_size=10)
    models = models_yaml([{"name": "m", "checkpoint": "missing"}])
    deployment = resolve_deployment(_settings(models, "m", INFERENCE_CHECKPOINT=override))
    assert deployment.checkpoint == override


def test_unknown_model_lists_the_known_ones(tmp_path: Path, models_yaml: WriteModels) -> None:
    models = models_yaml([{"name": "m", "checkpoint": "m"}])
    with pytest.raises(ConfigError, match=r"INFERENCE_MODEL: unknown model 'nope' \(known: m\)"):
        resolve_deployment(_settings(models, "nope"))


def test_missing_checkpoint_fails_fast(tmp_path: Path, models_yaml: WriteModels) -> None:
    models = models_yaml([{"name": "m", "checkpoint": "absent"}])
    with pytest.raises(ConfigError, match=r"no config\.json"):
        resolve_deployment(_settings(models, "m"))


def test_cuda_graphs_default_on_and_ignored_on_cpu() -> None:
    """On by default (measured on a GPU, ADR 0022); the CPU engine never pads to graph shapes,
    where fixed shapes would only cost."""
    from llm_inference.backends.factory import engine_config

    assert EngineSettings().cuda_graphs is True
    cpu = engine_config(replace(EngineSettings(), device="cpu"), max_context=None)
    assert cpu.device == "cpu"
    assert cpu.cuda_graphs is False
