"""A digest of everything that decides a model's token ids.

Two processes that load the same tokenizer files with the same tokenization code and library
versions return the same ids for the same input: that is what lets the router trust its own
ids once the tokenizer service reports an equal fingerprint (TokenizerService.Info). The
digest is deliberately conservative: any change to a file, to this package's code or to the
`tokenizers` and `jinja2` versions changes it, so a skewed rollout falls back to asking the
service, never to a silently different count.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from pathlib import Path

import jinja2
import tokenizers

FINGERPRINT_VERSION = b"llm-tokenization-fingerprint/1"


def fingerprint(directory: Path, files: Sequence[str]) -> str:
    """Hex digest of `files` under `directory` (absent ones count as absent) and the code."""
    h = hashlib.blake2b(digest_size=16)
    h.update(FINGERPRINT_VERSION + b"\0")
    h.update(code_digest())
    for name in sorted(files):
        path = directory / name
        h.update(name.encode("utf-8") + b"\0")
        if path.is_file():
            content = path.read_bytes()
            h.update(len(content).to_bytes(8, "big"))
            h.update(content)
        else:
            h.update(b"absent\0")
    return h.hexdigest()


@functools.cache
def code_digest() -> bytes:
    """The tokenization package's own source and its libraries' versions (read once)."""
    h = hashlib.blake2b(digest_size=16)
    for library in (tokenizers, jinja2):
        h.update(f"{library.__name__}={library.__version__}\0".encode())
    for source in sorted(Path(__file__).parent.glob("*.py")):
        h.update(source.name.encode("utf-8") + b"\0")
        h.update(source.read_bytes())
    return h.digest()
