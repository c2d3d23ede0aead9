"""The engine's CPU C++ kernels (csrc/): each built once with the local C++ compiler for this
machine's instruction set (-march=native), cached by torch under TORCH_EXTENSIONS_DIR (default
~/.cache/torch_extensions), loaded on first use. A kernel that cannot be built here (no
compiler, no headers) is reported once in the log and its caller falls back to plain torch.

The cached module's name carries a digest of the CPU's instruction-set flags: torch reuses a
build when the source and the flag *strings* match, and "-march=native" reads the same on
every CPU, so a cache built on an AVX-512 machine (an image layer, a shared home) would
otherwise be loaded on an AVX2 one and die of SIGILL at the first call.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import platform
import time
from pathlib import Path
from types import ModuleType

log = logging.getLogger(__name__)

CSRC = Path(__file__).resolve().parent / "csrc"
# -fopenmp: at::parallel_for is inline OpenMP in torch's headers and runs serially without
# it. The libgomp it links is torch's own (same soname, already loaded), not a second runtime.
FLAGS = ["-O3", "-march=native", "-fopenmp"]
LDFLAGS = ["-fopenmp"]

CPUINFO = Path("/proc/cpuinfo")

_loaded: dict[str, ModuleType | None] = {}


@functools.cache
def _this_cpu() -> str:
    """This machine's cpuinfo, read once per process ("" where there is none)."""
    try:
        return CPUINFO.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def cpu_signature(cpuinfo: str | None = None) -> str:
    """8 hex digits naming this CPU's instruction set (`cpuinfo`: this machine's by default):
    its feature flags where the kernel lists them (x86 "flags", Arm "Features"), else the
    machine and processor names."""
    if cpuinfo is None:
        cpuinfo = _this_cpu()
    features = next(
        (
            line.partition(":")[2]
            for line in cpuinfo.splitlines()
            if line.split(":")[0].strip() in ("flags", "Features")
        ),
        None,
    )
    text = (
        " ".join(sorted(features.split()))
        if features is not None
        else f"{platform.machine()} {platform.processor()}"
    )
    return hashlib.sha256(text.encode()).hexdigest()[:8]


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
            name=f"{name}_{cpu_signature()}",
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
