"""Open-loop load through the edge: latency against offered load, saturation, then a soak.

Starts the whole stack as `make up` does (free ports, its own Redis unless REDIS_URL is set, the
demo model on two generation replicas) and sends streaming ChatStream calls through Envoy:
1. steps of Poisson arrivals at set rates. Arrivals are scheduled by absolute time and never
   wait for completions (open loop); a request sent more than --late-ms after its arrival time
   is counted as late. Latencies are measured from the scheduled arrival, so a queue in the
   client counts against the platform as it would for a real client. Per step: TTFT, time per
   output token (TPOT), end-to-end p50/p90/p99, goodput (completed requests meeting the SLO
   per second) and error rate. A step is sustained when at least 90% of its requests meet
   the SLO, at most 1% fail and the number in flight does not keep growing; the knee is
   the first of two unsustained steps in a row (stepping stops there, going past --rates by
   x1.5 up to --max-rate if need be), and saturation is the highest rate sustained below it.
2. a soak at 70% of saturation, sampling every service's RSS (VmRSS from /proc/<pid>/status)
   every few seconds; growth = mean RSS over the last minute vs the first minute after
   warm-up (a quarter of the soak each when it is shorter than four minutes); goal <= 10%
   for every service and Envoy (Redis, which stores the ledger, is reported, not judged).
Writes the "load" and "soak" keys of bench/results/resilience.json (read-modify-write: other
benchmarks own other keys) and bench/results/load.png.

Usage: python bench/bench_load.py [--rates 0.5,1,2,3,4,6,8] [--step-s 60] [--soak-s 600]
       python bench/bench_load.py --replot   (redraw load.png from resilience.json)
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import tempfile
from pathlib import Path

from load_config import RESULTS, ROOT, TENANT, Options
from load_phases import measure
from load_plot import plot

from llm_stack import catalogue
from llm_stack.config import StackConfig, free_ports
from llm_stack.demo import start_with_key
from llm_stack.stack import Stack


def stack_config(run_dir: Path) -> StackConfig:
    config = StackConfig.from_env(ROOT, {**os.environ, "LLM_RUN_DIR": str(run_dir)})
    replicas = catalogue.local_replicas(config.models_config)
    return dataclasses.replace(
        config.with_ports(free_ports(tuple(r.port for r in replicas))),
        redis_prefix=f"benchload{os.getpid()}:",
        log_level="WARNING",  # per-request access logs would cost CPU the benchmark measures
    )


def parse(argv: list[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--rates", default="0.5,1,2,3,4,6,8", help="offered requests/s, comma-separated, ascending"
    )
    parser.add_argument(
        "--max-rate", type=float, default=64.0, help="keep stepping up to this while sustained"
    )
    parser.add_argument("--step-s", type=float, default=60.0, help="seconds of arrivals per rate")
    parser.add_argument("--soak-s", type=float, default=600.0, help="soak length; 0 skips it")
    parser.add_argument("--rss-interval-s", type=float, default=5.0)
    parser.add_argument("--slo-ttft-ms", type=float, default=2000.0)
    parser.add_argument("--slo-tpot-ms", type=float, default=150.0)
    parser.add_argument(
        "--late-ms", type=float, default=20.0, help="a send later than this is late"
    )
    parser.add_argument("--timeout-s", type=float, default=60.0, help="deadline of each call")
    parser.add_argument("--seed", type=int, default=9)
    parser.add_argument("--out", type=Path, default=RESULTS / "resilience.json")
    parser.add_argument(
        "--replot", action="store_true", help="only redraw load.png from the results file"
    )
    args = parser.parse_args(argv)
    rates = tuple(float(r) for r in args.rates.split(","))
    return Options(
        rates,
        args.max_rate,
        args.step_s,
        args.soak_s,
        args.rss_interval_s,
        args.slo_ttft_ms,
        args.slo_tpot_ms,
        args.late_ms,
        args.timeout_s,
        args.seed,
        args.out,
        args.replot,
    )


def main() -> None:
    opts = parse()
    if opts.replot:
        saved = json.loads(opts.out.read_text())
        plot(saved["load"], saved.get("soak"), opts.out.parent / "load.png")
        return
    with tempfile.TemporaryDirectory(prefix="bench-load-") as run_dir:
        config = stack_config(Path(run_dir))
        replicas = len(catalogue.generation_ports(catalogue.local_replicas(config.models_config)))
        stack = Stack(config)
        try:
            _, key = start_with_key(stack, tenant=TENANT, name="bench-load")
            asyncio.run(measure(stack, key, opts, replicas))
        finally:
            stack.stop()


if __name__ == "__main__":
    main()
