"""`make up MODEL=<checkpoint>`: a checkpoint written by transformers' own Llama / Qwen2 classes
is served through the edge and answers the openai client; a broken one is refused at start."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import REPO, _delete_prefix

pytestmark = pytest.mark.e2e

UP_TIMEOUT_S = 240.0
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] }}"
    "{{ eos_token + '\\n' }}{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
TEXT = ["The quick brown fox jumps over the lazy dog.", "Hello there, how are you today?"] * 20


def write_hf_checkpoint(path: Path, model_type: str) -> Path:
    """A tiny random model saved by transformers itself, with a fast tokenizer and template."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        PreTrainedTokenizerFast,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    specials = ["<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    raw.train_from_iterator(TEXT, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw, bos_token="<s>", eos_token="</s>", pad_token="</s>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    shape = {
        "vocab_size": raw.get_vocab_size(),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 1024,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "pad_token_id": 1,
    }
    torch.manual_seed(0)
    model = (
        LlamaForCausalLM(LlamaConfig(**shape))
        if model_type == "llama"
        else Qwen2ForCausalLM(Qwen2Config(**shape, tie_word_embeddings=True))
    )
    model.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    return path


def _lines(stream: object, sink: queue.Queue[str]) -> None:
    for line in stream:  # type: ignore[attr-defined]
        sink.put(line)


@pytest.fixture
def up_env(tmp_path: Path, redis_url: str) -> Iterator[dict[str, str]]:
    prefix = f"e2eown{uuid.uuid4().hex[:8]}:"
    env = {
        **os.environ,
        "LLM_RUN_DIR": str(tmp_path / "run"),
        "LLM_PORTS": "free",
        "REDIS_URL": redis_url,
        "LLM_REDIS_PREFIX": prefix,
    }
    try:
        yield env
    finally:
        _delete_prefix(redis_url, prefix)


def _start(env: dict[str, str], *args: str) -> tuple[subprocess.Popen[str], list[str]]:
    up = subprocess.Popen(
        [sys.executable, "-m", "llm_stack", "up", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=_lines, args=(up.stdout, lines), daemon=True)
    reader.start()
    seen: list[str] = []
    deadline = time.monotonic() + UP_TIMEOUT_S
    while not any("llmctl chat --model" in line for line in seen):
        if up.poll() is not None:
            reader.join(timeout=10)
            while not lines.empty():
                seen.append(lines.get())
            return up, seen
        assert time.monotonic() < deadline, "make up did not finish:\n" + "".join(seen)
        try:
            seen.append(lines.get(timeout=1))
        except queue.Empty:
            continue
    return up, seen


def _down(env: dict[str, str], up: subprocess.Popen[str]) -> None:
    if up.poll() is None:
        subprocess.run(
            [sys.executable, "-m", "llm_stack", "down"], cwd=REPO, env=env, timeout=120, check=False
        )
        up.wait(timeout=60)


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_own_checkpoint_is_served_through_the_edge(
    tmp_path: Path, up_env: dict[str, str], model_type: str
) -> None:
    import openai

    checkpoint = write_hf_checkpoint(tmp_path / f"tiny-{model_type}", model_type)
    name = f"tiny-{model_type}"
    up, seen = _start(up_env, "--model", str(checkpoint), "--model-name", name,
                      "--model-replicas", "1")  # fmt: skip
    try:
        assert up.poll() is None, "make up exited:\n" + "".join(seen)
        export = next(line for line in seen if "export LLM_API_ADDR=" in line)
        addr, key = export.split("LLM_API_ADDR=")[1].split(" LLM_API_KEY=")
        assert f'model="{name}"' in "".join(seen)  # the printed sample call
        client = openai.OpenAI(base_url=f"http://{addr}/v1", api_key=key.strip(), max_retries=0)
        reply = client.chat.completions.create(
            model=name, messages=[{"role": "user", "content": "Hello"}], max_tokens=8
        )
        assert reply.model == name
        assert reply.usage is not None
        assert reply.usage.completion_tokens > 0
        assert reply.choices[0].message.content is not None
        # The aliases follow the model: `llmctl chat` (model "demo") reaches it too.
        alias = client.chat.completions.create(
            model="demo", messages=[{"role": "user", "content": "Hi"}], max_tokens=4
        )
        assert alias.model == name
    finally:
        _down(up_env, up)


@pytest.mark.parametrize("damage", ["tokenizer", "architecture", "hash"])
def test_broken_checkpoint_is_refused_at_start(
    tmp_path: Path, up_env: dict[str, str], damage: str
) -> None:
    import hashlib
    import json

    checkpoint = write_hf_checkpoint(tmp_path / "broken", "llama")
    if damage == "tokenizer":
        (checkpoint / "tokenizer.json").unlink()
        expected = "no tokenizer.json"
    elif damage == "architecture":
        config = json.loads((checkpoint / "config.json").read_text())
        config |= {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}
        (checkpoint / "config.json").write_text(json.dumps(config))
        expected = "architecture GPT2LMHeadModel is not supported"
    else:
        weights = checkpoint / "model.safetensors"
        data = bytearray(weights.read_bytes())
        digest = hashlib.sha256(data).hexdigest()
        (checkpoint / "SHA256SUMS").write_text(f"{digest}  model.safetensors\n")
        data[-5] ^= 0x01
        weights.write_bytes(bytes(data))
        expected = "model.safetensors is corrupt: its SHA-256 does not match"
    up, seen = _start(up_env, "--model", str(checkpoint))
    try:
        assert up.wait(timeout=60) == 2
        text = "".join(seen).strip()
        assert text.splitlines() == [text]  # one line
        assert text.startswith(f"llm-stack: cannot serve {checkpoint}: {expected}")
    finally:
        _down(up_env, up)


def test_make_up_default_serves_demo_chat_in_english(up_env: dict[str, str]) -> None:
    """What `make up` runs (--model infra/model/demo-chat): llmctl's story is English words and
    a JSON-schema reply parses."""
    import json
    import re

    import openai

    up, seen = _start(up_env, "--model", str(REPO / "infra/model/demo-chat"))
    try:
        assert up.poll() is None, "make up exited:\n" + "".join(seen)
        export = next(line for line in seen if "export LLM_API_ADDR=" in line)
        addr, key = export.split("LLM_API_ADDR=")[1].split(" LLM_API_KEY=")
        env = up_env | {"LLM_API_ADDR": addr, "LLM_API_KEY": key.strip()}
        chat = subprocess.run(
            [str(Path(sys.executable).parent / "llmctl"), "chat", "Tell me a story",
             "--temperature", "0", "--max-tokens", "48", "--no-cache"],
            env=env, capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
        words = re.findall(r"[A-Za-z]+", chat.stdout)
        assert len(words) >= 8, chat.stdout
        assert sum(len(w) for w in words) >= 0.6 * len(chat.stdout.strip()), chat.stdout
        client = openai.OpenAI(base_url=f"http://{addr}/v1", api_key=key.strip(), max_retries=0)
        schema = {
            "type": "object",
            "properties": {"topic": {"type": "string", "maxLength": 40}},
            "required": ["topic"],
            "additionalProperties": False,
        }
        reply = client.chat.completions.create(
            model="demo-chat",
            messages=[{"role": "user", "content": "Describe a list as JSON."}],
            max_tokens=128,
            temperature=0,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "t", "schema": schema, "strict": True},
            },
        )
        assert isinstance(json.loads(reply.choices[0].message.content or ""), dict)
    finally:
        _down(up_env, up)
