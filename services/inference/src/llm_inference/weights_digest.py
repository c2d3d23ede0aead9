"""The digest of a checkpoint's weights, which Info reports so that a router admits only
replicas that serve the same weights as the rest of their deployment."""

from __future__ import annotations

import hashlib
from pathlib import Path

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
CHUNK_BYTES = 1 << 20


def weights_digest(checkpoint: Path) -> str:
    """sha256 (hex) over the checkpoint's weight files, each name then its bytes, in name order;
    "" when it has none. Reads every byte once at start-up (about a second per GB)."""
    files = sorted(p for p in checkpoint.iterdir() if p.suffix in WEIGHT_SUFFIXES and p.is_file())
    if not files:
        return ""
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as f:
            while chunk := f.read(CHUNK_BYTES):
                digest.update(chunk)
    return digest.hexdigest()
