"""Whether a Hugging Face checkpoint directory can be served, decided before anything starts.

Checks, each failing with one line (UnservableCheckpointError): config.json names a supported
architecture with a servable dtype; the safetensors files are whole (headers parse, tensors lie
inside the file, and any SHA256SUMS / *.sha256 entries match); tokenizer.json and a chat
template exist; the weights of all its replicas fit in the memory available now.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# What services/inference loads (llm_inference.engine.models.config.SUPPORTED_MODEL_TYPES).
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
}
# Bytes per parameter of a checkpoint dtype; the CPU replicas compute in float32.
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
SAFETENSORS_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "I64": 8, "I32": 4, "I8": 1, "U8": 1}
SERVE_BYTES_PER_PARAM = 4
# Per replica: the Python process, torch, its KV cache and activations (measured ~450 MB for
# demo-llama's replica), plus 20 % of the weights for transient copies while loading.
REPLICA_OVERHEAD_BYTES = 600 * 2**20
INDEX_FILE = "model.safetensors.index.json"
CHECKSUM_FILE = "SHA256SUMS"
MAX_HEADER_BYTES = 100 * 2**20


class UnservableCheckpointError(ValueError):
    """The directory cannot be served; str() is the one line the user sees."""


@dataclass(frozen=True, slots=True)
class CheckpointFacts:
    path: Path
    model_type: str
    parameters: int
    dtype: str
    context_length: int
    needed_bytes: int  # for all replicas
    available_bytes: int | None


def _json(path: Path, what: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UnservableCheckpointError(f"no {path.name} ({what})") from None
    except (OSError, ValueError) as exc:
        raise UnservableCheckpointError(f"{path.name} is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise UnservableCheckpointError(f"{path.name} is not a JSON object")
    return data


def check_config(config: dict[str, Any]) -> tuple[str, str]:
    """(model_type, dtype) of a servable config.json."""
    model_type = str(config.get("model_type", ""))
    architectures = [str(a) for a in config.get("architectures") or []]
    supported = ", ".join(ARCHITECTURES.values())
    if model_type not in ARCHITECTURES or (
        architectures and ARCHITECTURES[model_type] not in architectures
    ):
        found = "/".join(architectures) or model_type or "none given"
        raise UnservableCheckpointError(
            f"architecture {found} is not supported (supported: {supported})"
        )
    if config.get("hidden_act", "silu") != "silu":
        raise UnservableCheckpointError(f"hidden_act {config.get('hidden_act')!r} is not supported")
    dtype = str(config.get("dtype") or config.get("torch_dtype") or "float32")
    if dtype not in DTYPE_BYTES:
        raise UnservableCheckpointError(
            f"dtype {dtype} is not supported ({', '.join(DTYPE_BYTES)})"
        )
    missing = [k for k in ("hidden_size", "num_hidden_layers", "vocab_size") if k not in config]
    if missing:
        raise UnservableCheckpointError(f"config.json lacks {', '.join(missing)}")
    return model_type, dtype


def weight_files(path: Path) -> list[Path]:
    index = path / INDEX_FILE
    if index.is_file():
        weight_map = _json(index, "sharded index").get("weight_map")
        if not isinstance(weight_map, dict):
            raise UnservableCheckpointError(f"{INDEX_FILE} has no weight_map")
        files = [path / str(name) for name in sorted(set(weight_map.values()))]
        absent = [f.name for f in files if not f.is_file()]
        if absent:
            raise UnservableCheckpointError(f"missing safetensors shards: {', '.join(absent)}")
        return files
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise UnservableCheckpointError("no *.safetensors weights (other formats are not served)")
    return files


def safetensors_parameters(file: Path) -> int:
    """Parameter count from the header; raises when the file is not a whole safetensors file."""
    size = file.stat().st_size
    try:
        with file.open("rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if not 0 < length <= min(MAX_HEADER_BYTES, size - 8):
                raise ValueError("bad header length")
            header = json.loads(f.read(length))
        if not isinstance(header, dict):
            raise ValueError("header is not a JSON object")
        end, params = 0, 0
        for name, info in header.items():
            if name == "__metadata__":
                continue
            begin, stop = (int(x) for x in info["data_offsets"])
            count = 1
            for dim in info["shape"]:
                count *= int(dim)
            if stop - begin != count * SAFETENSORS_BYTES[info["dtype"]] or begin > stop:
                raise ValueError(f"tensor {name} has inconsistent offsets")
            end, params = max(end, stop), params + count
    except (OSError, ValueError, KeyError, TypeError, struct.error) as exc:
        raise UnservableCheckpointError(f"{file.name} is corrupt ({exc})") from None
    if 8 + length + end != size:
        raise UnservableCheckpointError(
            f"{file.name} is corrupt: {size} bytes, the header describes {8 + length + end}"
        )
    return params


def verify_checksums(path: Path) -> int:
    """Check `SHA256SUMS` (sha256sum's format) and `NAME.sha256` files; how many matched."""
    expected: dict[str, str] = {}
    sums = path / CHECKSUM_FILE
    if sums.is_file():
        for line in sums.read_text(encoding="utf-8").splitlines():
            digest, _, name = line.strip().partition(" ")
            if digest and name:
                expected[name.strip().lstrip("*")] = digest.lower()
    for side in path.glob("*.sha256"):
        expected[side.name.removesuffix(".sha256")] = side.read_text().split()[0].lower()
    for name, digest in sorted(expected.items()):
        target = path / name
        if not target.is_file():
            raise UnservableCheckpointError(f"{CHECKSUM_FILE} lists {name}, which is missing")
        h = hashlib.sha256()
        with target.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        if h.hexdigest() != digest:
            raise UnservableCheckpointError(
                f"{name} is corrupt: its SHA-256 does not match {digest[:12]}…"
            )
    return len(expected)


def check_tokenizer(path: Path) -> None:
    tokenizer = _json(path / "tokenizer.json", "a fast tokenizer is required")
    if "model" not in tokenizer:
        raise UnservableCheckpointError("tokenizer.json is not a tokenizers file (no `model`)")
    config = _json(path / "tokenizer_config.json", "the tokenizer's settings")
    if not config.get("chat_template") and not (path / "chat_template.jinja").is_file():
        raise UnservableCheckpointError("no chat template (tokenizer_config.json chat_template)")


def available_memory() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def validate(path: Path, replicas: int, available: int | None = None) -> CheckpointFacts:
    """Facts of a servable checkpoint at `path`, else UnservableCheckpointError."""
    if not path.is_dir():
        raise UnservableCheckpointError("not a directory")
    config = _json(path / "config.json", "the model's Hugging Face config")
    model_type, dtype = check_config(config)
    check_tokenizer(path)
    params = sum(safetensors_parameters(f) for f in weight_files(path))
    verify_checksums(path)
    weights = params * SERVE_BYTES_PER_PARAM
    needed = replicas * (int(weights * 1.2) + REPLICA_OVERHEAD_BYTES)
    available = available if available is not None else available_memory()
    if available is not None and needed > available:
        raise UnservableCheckpointError(
            f"{params / 1e6:.0f}M parameters need ~{needed / 2**30:.1f} GiB for {replicas} "
            f"float32 replica(s); {available / 2**30:.1f} GiB is available "
            f"(fewer replicas: MODEL_REPLICAS=1)"
        )
    context = int(config.get("max_position_embeddings") or 2048)
    return CheckpointFacts(path, model_type, params, dtype, context, needed, available)
