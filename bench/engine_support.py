"""Helpers of the engine benchmarks (bench_structured too): goals, timing, passive OpenMP."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def timed(sections: dict[str, float], name: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        sections[name] = time.perf_counter() - start


def goal(value: float, target: float, *, higher: bool) -> dict[str, Any]:
    return {"value": value, "target": target, "met": value >= target if higher else value <= target}


def ensure_passive_openmp() -> None:
    """Re-exec with OMP_WAIT_POLICY=PASSIVE unless the caller chose a policy.

    OpenMP threads spin while they wait by default; on a machine shared with other processes a
    descheduled thread then stalls every parallel region (10x slower steps were measured on a
    loaded 2-core VM). The policy is read when torch loads, hence the re-exec.
    """
    if "OMP_WAIT_POLICY" not in os.environ:
        env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
