#!/usr/bin/env bash
# GPU benchmark of the inference engine (bench/gpu/main.py): bf16 greedy outputs against
# transformers, throughput of a random ~1.1B Llama at batch 1/16/64, decode step time against
# the memory-bandwidth roofline -> bench/results/gpu.json. Bounded to 8 minutes.
#
#   bench/gpu/run.sh             on a machine with an NVIDIA GPU (CUDA build of torch)
#   bench/gpu/run.sh --dry-run   the same code paths on CPU with a tiny model (seconds)
#   bench/gpu/run.sh --dry-run --device cuda   the tiny model on the GPU: a smoke test first
#
# PYTHON overrides the interpreter (default: the repo's .venv, else python3).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
  if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi
# The engine's sources too, so a python3 that has torch + transformers but not this project
# installed (a bare GPU machine) runs it as it is.
export PYTHONPATH="bench:services/inference/src:libs/llm-common/src${PYTHONPATH:+:$PYTHONPATH}"
exec timeout --kill-after=10 "${GPU_BENCH_TIMEOUT_S:-470}" "$PY" -m gpu.main "$@"
