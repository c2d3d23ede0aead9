"""The engine's CPU C++ kernels (csrc/): each built once with the local C++ compiler for this
machine's instruction set (-march=native), cached by torch under TORCH_EXTENSIONS_DIR (default
~/.cache/torch_extensions), loaded on first use. A kernel that cannot be built here (no
compiler, no headers) is reported once in the log and its caller falls back to plain torch.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from types import ModuleType

log = logging.getLogger(__name__)

CSRC = Path(__file__).resolve().parent / "csrc"
# -fopenmp: at::parallel_for is inline OpenMP in torch's headers and runs serially without
# it. The libgomp it links is torch's own (same soname, already loaded), not a second runtime.
FLAGS = ["-O3", "-march=native", "-fopenmp"]
LDFLAGS = ["-fopenmp"]

_loaded: dict[str, ModuleType | None] = {}


def load_extension(name: str, source: str, purpose: str) -> ModuleType | None:
    """The compiled module `name` built from csrc/`source`, or None when it cannot be built.

    `name` carries a version: bump it with an incompatible source change (torch also rebuilds
    when the source hash changes). `purpose` names the kernel in the log.
    """
    if name in _loaded:
        return _loaded[name]
    from torch.utils.cpp_extension import load  # deferred: imports setuptools machinery

    start = time.perf_counter()
    try:
        module: ModuleType = load(
            name=name,
            sources=[str(CSRC / source)],
            extra_cflags=FLAGS,
            extra_ldflags=LDFLAGS,
            verbose=False,
        )
    except (OSError, RuntimeError, ImportError) as exc:  # no compiler, no headers, link error
        log.warning("%s unavailable, falling back to plain torch: %s", purpose, exc)
        _loaded[name] = None
        return None
    log.info("%s ready in %.1f s", purpose, time.perf_counter() - start)
    _loaded[name] = module
    return module
