"""The CPU paged-decode kernel (csrc/paged_decode.cpp): built once with the local C++ compiler,
cached by torch under TORCH_EXTENSIONS_DIR (default ~/.cache/torch_extensions), loaded on use.

Building takes about 45 s of CPU on first use (`make bench-model` and `make setup` do not build
it; `python -m llm_inference.engine.paged_kernel` does, ahead of serving). Without a compiler
the engine falls back to the gather path and says so once in the log.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).resolve().parent / "csrc" / "paged_decode.cpp"
# Bump with an incompatible source change (torch also rebuilds when the source hash changes).
NAME = "llm_paged_decode_v1"
FLAGS = ["-O3", "-march=native", "-fopenmp-simd"]

PagedDecodeFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor
]

_loaded: dict[str, PagedDecodeFn | None] = {}


def load_kernel() -> PagedDecodeFn | None:
    """The compiled paged_decode function, or None when it cannot be built here."""
    if NAME in _loaded:
        return _loaded[NAME]
    from torch.utils.cpp_extension import load  # deferred: imports setuptools machinery

    start = time.perf_counter()
    try:
        module = load(name=NAME, sources=[str(SOURCE)], extra_cflags=FLAGS, verbose=False)
    except (OSError, RuntimeError, ImportError) as exc:  # no compiler, no headers, link error
        log.warning("paged decode kernel unavailable, using the gather path: %s", exc)
        _loaded[NAME] = None
        return None
    log.info("paged decode kernel ready in %.1f s", time.perf_counter() - start)
    fn: PagedDecodeFn = module.paged_decode
    _loaded[NAME] = fn
    return fn


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    return 0 if load_kernel() is not None else 1


if __name__ == "__main__":
    sys.exit(main())
