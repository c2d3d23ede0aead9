"""bench/gpu/run.sh: --dry-run runs the GPU benchmark's code paths (checkpoint build, engine
throughput at batch 1/16/64, roofline, bf16 check against transformers) on CPU with a tiny
model; without CUDA and without --dry-run it refuses with a clear message."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RUN = REPO / "bench" / "gpu" / "run.sh"


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(RUN), *args],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE", **(env or {})},
        check=False,
    )


@pytest.mark.slow
def test_dry_run_measures_and_checks_the_tiny_model(tmp_path: Path) -> None:
    proc = _run("--dry-run", "--out", str(tmp_path), "--model-dir", str(tmp_path / "model"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "gpu-dry-run.json").read_text("utf-8"))
    assert summary["dry_run"] is True
    assert summary["dtype"] == "bfloat16"
    check = summary["correctness"]
    assert check["passed"]
    assert check["tokens_checked"] == check["cases"] * 8
    shortfall = check["criteria"]["max_top1_shortfall"]
    assert check["engine_top1_vs_float32"] >= check["transformers_bf16_top1_vs_float32"] - shortfall
    # The tiny model is not chaotic in bf16: the engine matches transformers-bf16 outright.
    assert check["teacher_forced_top1_agreement"] == 1.0
    assert summary["copy_bandwidth_gb_per_s"] > 0
    assert check["cuda_graphs"]["passed"]
    assert check["cuda_graphs"]["tokens_checked"] == check["tokens_checked"]
    assert set(summary["throughput"]) == {"batch=1", "batch=16", "batch=64"}
    assert set(summary["throughput_cuda_graphs"]) == set(summary["throughput"])
    rows = [*summary["throughput"].items(), *summary["throughput_cuda_graphs"].items()]
    for name, row in rows:
        batch = int(name.split("=")[1])
        assert row["output_tokens"] == batch * summary["workload"]["max_tokens"]
        decode = row["decode"]
        assert decode["measured_step_ms"] > 0
        assert decode["roofline_step_ms"] > 0
        assert decode["kv_bytes"] > 0
        assert decode["weight_bytes"] > 0
    # More sequences read more KV: the roofline grows with the batch.
    floors = [summary["throughput"][f"batch={b}"]["decode"]["kv_bytes"] for b in (1, 16, 64)]
    assert floors == sorted(floors)
    assert floors[0] < floors[-1]


def test_without_cuda_it_asks_for_a_gpu_or_dry_run(tmp_path: Path) -> None:
    proc = _run("--out", str(tmp_path), env={"CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 2
    assert "no CUDA device" in proc.stderr
    assert "--dry-run" in proc.stderr
    assert not (tmp_path / "gpu.json").exists()


@pytest.mark.slow
def test_profile_step_reports_host_ops_per_step_on_cpu(tmp_path: Path) -> None:
    """bench/gpu/profile_step.py (the GPU step profile) runs its code paths on CPU too."""
    env = {**os.environ, "PYTHONPATH": "bench:services/inference/src:libs/llm-common/src"}
    build = "from gpu.model import TINY, build_checkpoint; import sys; "
    build += "build_checkpoint(TINY, __import__('pathlib').Path(sys.argv[1]), 'cpu')"
    model = tmp_path / "model"
    python = sys.executable
    subprocess.run([python, "-c", build, str(model)], cwd=REPO, env=env, check=True, timeout=120)
    out = tmp_path / "profile.json"
    args = ["-m", "gpu.profile_step", str(model), str(out), "--device", "cpu", "--batch", "2"]
    proc = subprocess.run(
        [python, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(out.read_text("utf-8"))
    assert [(r["batch"], r["cuda_graphs"]) for r in results] == [(2, False), (2, True)]
    for result in results:
        assert result["wall_ms_per_step_profiled"] > 0
        assert result["kernels_per_step"] == 0  # no GPU kernels on CPU
        assert result["top_host_ops"]
        assert all(op["self_cpu_ms_per_step"] >= 0 for op in result["top_host_ops"])
