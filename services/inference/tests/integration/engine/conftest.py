"""Tiny random Llama-family checkpoints built at test time, and engine helpers for them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from llm_inference.engine.api import SamplingOptions
from llm_inference.engine.config import EngineConfig
from llm_inference.engine.core import EngineCore
from llm_inference.engine.loader import load_model
from llm_inference.engine.sequence import Sequence as EngineSeq

VOCAB = 384
# initializer_range 0.2 keeps random logits spread out, so greedy decoding is not degenerate.
COMMON: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 256,
    "initializer_range": 0.2,
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": None,
}

LAYOUTS: dict[str, tuple[type[Any], type[Any], dict[str, Any]]] = {
    "llama-gqa-untied": (
        transformers.LlamaConfig,
        transformers.LlamaForCausalLM,
        {"num_key_value_heads": 2, "tie_word_embeddings": False},
    ),
    "llama-mha-tied": (
        transformers.LlamaConfig,
        transformers.LlamaForCausalLM,
        {"num_key_value_heads": 4, "tie_word_embeddings": True},
    ),
    "qwen2-gqa-bias": (
        transformers.Qwen2Config,
        transformers.Qwen2ForCausalLM,
        {"num_key_value_heads": 1, "tie_word_embeddings": True},
    ),
    "mistral-gqa": (
        transformers.MistralConfig,
        transformers.MistralForCausalLM,
        {"num_key_value_heads": 2, "tie_word_embeddings": False, "sliding_window": None},
    ),
    "llama3-rope": (
        transformers.LlamaConfig,
        transformers.LlamaForCausalLM,
        {
            "num_key_value_heads": 2,
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 10000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        },
    ),
    "linear-rope-sharded": (
        transformers.LlamaConfig,
        transformers.LlamaForCausalLM,
        {
            "num_key_value_heads": 2,
            "rope_parameters": {"rope_type": "linear", "rope_theta": 500.0, "factor": 2.0},
        },
    ),
}


def build_checkpoint(name: str, out: Path) -> Path:
    """Seeded random checkpoint of one layout, saved as safetensors (sharded for *-sharded)."""
    config_cls, model_cls, extra = LAYOUTS[name]
    torch.manual_seed(sum(map(ord, name)))
    model = model_cls(config_cls(**{**COMMON, **extra})).eval()
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            if param_name.endswith("bias"):
                param.normal_(0.0, 0.2)  # HF initialises biases to zero, which would test nothing
    shard = "100KB" if name.endswith("sharded") else "1GB"
    model.save_pretrained(out, max_shard_size=shard)
    return out


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Factory: layout name -> checkpoint directory (built once per session)."""
    built: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in built:
            built[name] = build_checkpoint(name, tmp_path_factory.mktemp(name))
        return built[name]

    return get


@pytest.fixture(scope="session")
def hf_models() -> Callable[[Path], Any]:
    """Factory: checkpoint directory -> the transformers model (float32, eval), cached."""
    loaded: dict[Path, Any] = {}

    def get(path: Path) -> Any:
        if path not in loaded:
            loaded[path] = transformers.AutoModelForCausalLM.from_pretrained(
                path, dtype=torch.float32, local_files_only=True
            ).eval()
        return loaded[path]

    return get


class Kit:
    """Helpers shared by the engine integration tests (handed out by the `kit` fixture)."""

    @staticmethod
    def make_core(path: Path, **overrides: Any) -> EngineCore:
        """An EngineCore over a tiny checkpoint (float32, CPU, small KV budget by default)."""
        config = replace(EngineConfig(kv_cache_memory_bytes=4 << 20, kv_block_size=4), **overrides)
        model = load_model(
            path,
            dtype=config.dtype,
            device=config.device,
            max_positions=256,
            quantization=config.quantization,
        )
        return EngineCore(model, config, model_name=path.name)

    @staticmethod
    def run_to_completion(
        core: EngineCore,
        requests: Sequence[tuple[str, Sequence[int], SamplingOptions]],
        max_steps: int = 10_000,
    ) -> dict[str, list[int]]:
        """Submit all requests at once, step until done, return generated ids per request."""
        for request_id, prompt, sampling in requests:
            core.add_request(request_id, prompt, sampling)
        outputs: dict[str, list[int]] = {rid: [] for rid, _, _ in requests}
        for _ in range(max_steps):
            if not core.has_work:
                break
            for emitted in core.step():
                outputs[emitted.request_id].extend(emitted.event.token_ids)
        assert not core.has_work, "engine did not finish within max_steps"
        return outputs

    @staticmethod
    def hf_greedy(hf_model: Any, prompt: Sequence[int], new_tokens: int) -> list[int]:
        """transformers' greedy continuation of one unpadded prompt."""
        ids = torch.tensor([list(prompt)])
        with torch.inference_mode():
            out = hf_model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=0,
            )
        return [int(t) for t in out[0, len(prompt) :]]

    @staticmethod
    def decode_logits(
        core: EngineCore, prompts: Sequence[Sequence[int]], steps: int, token: int
    ) -> list[torch.Tensor]:
        """Prefill, then `steps` teacher-forced decode steps feeding `token`: every step's
        logits through the model runner alone, rows ordered by request id."""
        for i, prompt in enumerate(prompts):
            seq = EngineSeq(
                f"s{i}", list(prompt), len(prompt), SamplingOptions(), 100, arrival_index=i
            )
            core.scheduler.add(seq)
        logits = []
        for _ in range(steps + 1):
            output = core.scheduler.schedule()
            result = core.runner.execute(output.chunks)
            for chunk in output.chunks:
                chunk.seq.num_computed_tokens = chunk.end
                core.block_manager.cache_full_blocks(chunk.seq)
            sampled = result.sampled
            order = sorted(range(len(sampled)), key=lambda i: sampled[i].seq.request_id)
            logits.append(result.logits[order].clone())
            for chunk in sampled:
                chunk.seq.token_ids.append(token)
        return logits

    @staticmethod
    def random_prompts(seed: int, lengths: Sequence[int], vocab: int = VOCAB) -> list[list[int]]:
        generator = torch.Generator().manual_seed(seed)
        return [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in lengths]


@pytest.fixture
def kit() -> type[Kit]:
    return Kit


@pytest.fixture
def greedy() -> Callable[[int], SamplingOptions]:
    """Factory: n -> greedy options producing exactly n tokens."""
    return lambda n: SamplingOptions(temperature=0.0, max_tokens=n, ignore_eos=True)
