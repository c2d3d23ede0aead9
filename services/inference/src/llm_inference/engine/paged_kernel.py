"""The CPU paged-attention kernel (csrc/paged_decode.cpp: decode rows and prefill chunks over
the block tables), built and cached by cpu_ext.

Building takes about 45 s of CPU on first use (`make bench-model` and `make setup` do not build
it; `python -m llm_inference.engine.paged_kernel` builds it, the packed-linear kernel and the
fused ops ahead of serving, for this CPU: cpu_ext). Without a compiler the engine falls back to
the gather path and torch's own ops and says so once in the log.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

import torch

from .cpu_ext import load_extension
from .fused_ops import load_fused_ops
from .packed_linear import load_packed_kernel

# (q, k_cache, v_cache, tables, table_rows, lens, scale) -> attention output; csrc/paged_decode.cpp.
PagedDecodeFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float],
    torch.Tensor,
]


def load_kernel() -> PagedDecodeFn | None:
    """The compiled paged_decode function, or None when it cannot be built here."""
    module = load_extension("llm_paged_decode_v7", "paged_decode.cpp", "paged decode kernel")
    if module is None:
        return None
    fn: PagedDecodeFn = module.paged_decode
    return fn


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    built = (load_kernel(), load_packed_kernel(), load_fused_ops())
    return 0 if all(kernel is not None for kernel in built) else 1


if __name__ == "__main__":
    sys.exit(main())
