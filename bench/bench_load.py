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
import contextlib
import dataclasses
import fcntl
import json
import os
import platform
import random
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from llm_stack import catalogue
from llm_stack.config import StackConfig, free_ports
from llm_stack.demo import start_with_key
from llm_stack.stack import Stack
from llmapi.common.v1 import common_pb2
from llmapi.llm.v1 import llm_service_pb2 as pb
from llmapi.llm.v1 import llm_service_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
MODEL = "demo-llama"
TENANT = "demo"
SUSTAINED_SHARE = 0.9  # share of a step's requests meeting the SLO for it to be sustained
MAX_ERROR_RATE = 0.01
BACKLOG_GROWTH, BACKLOG_SLACK = 1.5, 4.0  # last-quarter in-flight above 1.5x (+4) the second's
SOAK_SHARE = 0.7
RSS_GOAL_PCT = 10.0
# Redis holds the usage ledger and rate-limit state: it grows with traffic by design, so its
# RSS is reported but not held to the goal (the stack starts it only without REDIS_URL).
DATA_STORES = {"redis": "stores the usage ledger; grows with the requests served"}
# (share, words in the prompt) and (share, tokens to generate): a mix of chat-sized requests
PROMPT_MIX = ((0.5, 8), (0.3, 48), (0.2, 160))
OUTPUT_MIX = ((0.4, 8), (0.4, 32), (0.2, 96))
WORDS = (
    "river",
    "mountain",
    "sea",
    "forest",
    "city",
    "light",
    "stone",
    "cloud",
    "garden",
    "story",
    "music",
    "winter",
    "road",
    "window",
    "market",
    "bridge",
    "harbour",
    "field",
)


@dataclass(frozen=True)
class Options:
    rates: tuple[float, ...]
    max_rate: float
    step_s: float
    soak_s: float
    rss_interval_s: float
    slo_ttft_ms: float
    slo_tpot_ms: float
    late_ms: float
    timeout_s: float
    seed: int
    out: Path
    replot: bool = False


@dataclass
class Outcome:
    """One request: times in seconds on the monotonic clock, relative to nothing."""

    due: float
    sent: float = 0.0
    first: float | None = None
    done: float = 0.0
    tokens: int = 0
    code: str = "OK"
    details: str = ""
    inflight: int = 0  # requests still unanswered when this one was sent


@dataclass
class Sampler:
    """RSS of every stack process, sampled while a soak runs."""

    pids: dict[str, int]
    samples: list[tuple[float, dict[str, int]]] = field(default_factory=list)

    def sample(self, at: float) -> None:
        self.samples.append((at, {name: rss_kib(pid) for name, pid in self.pids.items()}))


def rss_kib(pid: int) -> int:
    """VmRSS of `pid` in KiB; 0 once the process is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return 0
    return 0


def pick(rng: random.Random, mix: tuple[tuple[float, int], ...]) -> int:
    roll, total = rng.random(), 0.0
    for share, value in mix:
        total += share
        if roll < total:
            return value
    return mix[-1][1]


def request(rng: random.Random) -> pb.ChatStreamRequest:
    words = " ".join(rng.choice(WORDS) for _ in range(pick(rng, PROMPT_MIX)))
    sampling = common_pb2.SamplingParams(
        max_tokens=pick(rng, OUTPUT_MIX),
        temperature=0.8,
        seed=rng.randrange(1 << 31),
        ignore_eos=True,  # the output mix is exact: the demo model's EOS would cut it short
    )
    message = common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content=f"Tell me about {words}")
    return pb.ChatStreamRequest(
        model=MODEL, messages=[message], sampling=sampling, cache=pb.CachePolicy(bypass=True)
    )


def arrivals(rng: random.Random, rate: float, duration_s: float) -> Iterator[float]:
    """Poisson arrival offsets (seconds from the start) over `duration_s`."""
    at = rng.expovariate(rate)
    while at < duration_s:
        yield at
        at += rng.expovariate(rate)


class Client:
    """Streams ChatStream calls through the edge and records what happened to each."""

    def __init__(self, edge: str, key: str, timeout_s: float) -> None:
        self._channel = grpc.aio.insecure_channel(edge)
        self._stub = pb_grpc.LLMServiceStub(self._channel)
        self._metadata = (("authorization", f"Bearer {key}"),)
        self._timeout_s = timeout_s

    async def one(self, message: pb.ChatStreamRequest, outcome: Outcome) -> None:
        outcome.sent = time.monotonic()
        call = self._stub.ChatStream(message, metadata=self._metadata, timeout=self._timeout_s)
        try:
            async for reply in call:
                # the first visible text (the output guard may hold early tokens back)
                if outcome.first is None and (reply.delta or reply.finish_reason):
                    outcome.first = time.monotonic()
                if reply.usage.completion_tokens:
                    outcome.tokens = reply.usage.completion_tokens
        except grpc.aio.AioRpcError as err:
            outcome.code = err.code().name
            outcome.details = (err.details() or "")[:200]
        outcome.done = time.monotonic()

    async def close(self) -> None:
        await self._channel.close()


async def open_loop(
    client: Client, rng: random.Random, rate: float, duration_s: float
) -> list[Outcome]:
    """Sends at Poisson times from now for `duration_s`, then waits for every answer."""
    start = time.monotonic()
    outcomes: list[Outcome] = []
    tasks: list[asyncio.Task[None]] = []
    pending: set[asyncio.Task[None]] = set()
    for offset in arrivals(rng, rate, duration_s):
        due = start + offset
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        outcome = Outcome(due=due, inflight=len(pending))
        outcomes.append(outcome)
        task = asyncio.create_task(client.one(request(rng), outcome))
        pending.add(task)
        task.add_done_callback(pending.discard)
        tasks.append(task)
    await asyncio.gather(*tasks)
    return outcomes


def percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p90": None, "p99": None}
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)

    return {"p50": at(0.50), "p90": at(0.90), "p99": at(0.99)}


def tpot_ms(o: Outcome) -> float | None:
    if o.first is None or o.tokens < 2:
        return None
    return (o.done - o.first) * 1000 / (o.tokens - 1)


def meets_slo(o: Outcome, opts: Options) -> bool:
    if o.code != "OK" or o.first is None:
        return False
    tpot = tpot_ms(o)
    return (o.first - o.due) * 1000 <= opts.slo_ttft_ms and (
        tpot is None or tpot <= opts.slo_tpot_ms
    )


def summarize(
    outcomes: list[Outcome], rate: float, duration_s: float, opts: Options
) -> dict[str, Any]:
    ok = [o for o in outcomes if o.code == "OK"]
    errors: dict[str, int] = {}
    examples: dict[str, str] = {}
    for o in outcomes:
        if o.code != "OK":
            errors[o.code] = errors.get(o.code, 0) + 1
            examples.setdefault(o.code, o.details)
    tpots = [t for t in map(tpot_ms, ok) if t is not None]
    good = sum(meets_slo(o, opts) for o in outcomes)
    sent = len(outcomes)
    return {
        "offered_rps": rate,
        "duration_s": duration_s,
        "sent": sent,
        "arrival_rps": round(sent / duration_s, 3),
        "late_sends": sum((o.sent - o.due) * 1000 > opts.late_ms for o in outcomes),
        "completed": len(ok),
        "errors": errors,
        "error_examples": examples,
        "error_rate": round((sent - len(ok)) / sent, 4) if sent else 0.0,
        "backlog": backlog(outcomes),
        "throughput_rps": round(len(ok) / duration_s, 3),
        "output_tokens_per_s": round(sum(o.tokens for o in ok) / duration_s, 1),
        "goodput_rps": round(good / duration_s, 3),
        "slo_attainment": round(good / sent, 4) if sent else 0.0,
        "ttft_ms": percentiles([(o.first - o.due) * 1000 for o in ok if o.first is not None]),
        "tpot_ms": percentiles(tpots),
        "e2e_ms": percentiles([(o.done - o.due) * 1000 for o in ok]),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }


def sustained(step: dict[str, Any]) -> bool:
    # against the requests actually drawn: a Poisson step of 30 s is +-20% off its rate
    kept_up = step["slo_attainment"] >= SUSTAINED_SHARE and step["error_rate"] <= MAX_ERROR_RATE
    return bool(kept_up and not step["backlog"]["growing"])


def backlog(outcomes: list[Outcome]) -> dict[str, Any]:
    """Requests in flight at arrival, second quarter of the step vs the last: a queue that
    keeps growing means overload even while continuous batching still gives every new
    request its first token quickly (it fills the KV cache first, then queues)."""
    n = len(outcomes)
    second = [o.inflight for o in outcomes[n // 4 : n // 2]]
    last = [o.inflight for o in outcomes[3 * n // 4 :]]
    early, late = _mean(second), _mean(last)
    growing = n >= 8 and late > BACKLOG_GROWTH * early + BACKLOG_SLACK
    return {"inflight_q2": round(early, 1), "inflight_q4": round(late, 1), "growing": growing}


def schedule(opts: Options) -> Iterator[float]:
    """The given rates, then x1.5 steps up to --max-rate until the knee is found."""
    yield from opts.rates
    rate = opts.rates[-1] * 1.5
    while rate <= opts.max_rate:
        yield round(rate, 2)
        rate *= 1.5


async def steps(client: Client, opts: Options) -> list[dict[str, Any]]:
    rng = random.Random(opts.seed)
    results: list[dict[str, Any]] = []
    for rate in schedule(opts):
        outcomes = await open_loop(client, rng, rate, opts.step_s)
        step = summarize(outcomes, rate, opts.step_s, opts)
        results.append(step)
        shown = ("offered_rps", "goodput_rps", "error_rate", "ttft_ms", "e2e_ms", "loadavg")
        print(json.dumps({k: step[k] for k in shown}), flush=True)
        if knee(results) is not None:
            break
    return results


def knee(results: list[dict[str, Any]]) -> int | None:
    """Index of the first of two unsustained steps in a row: one marginal step on a busy
    machine is noise, two are the knee."""
    for i in range(len(results) - 1):
        if not sustained(results[i]) and not sustained(results[i + 1]):
            return i
    return None


def saturation(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The highest offered rate sustained below the knee (or anywhere, if none was found)."""
    at = knee(results)
    below = results if at is None else results[:at]
    best = max((s["offered_rps"] for s in below if sustained(s)), default=None)
    peak = max((s["throughput_rps"] for s in results), default=0.0)
    return {"saturation_rps": best, "reached": at is not None, "peak_throughput_rps": peak}


async def soak(client: Client, sampler: Sampler, rate: float, opts: Options) -> dict[str, Any]:
    stop = asyncio.Event()

    async def sample() -> None:
        start = time.monotonic()
        while not stop.is_set():
            sampler.sample(time.monotonic() - start)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), opts.rss_interval_s)

    sampling = asyncio.create_task(sample())
    outcomes = await open_loop(client, random.Random(opts.seed + 1), rate, opts.soak_s)
    stop.set()
    await sampling
    summary = summarize(outcomes, rate, opts.soak_s, opts)
    # RSS growth under overload is mostly queued work: say whether the soak kept up
    return {**summary, "sustained": sustained(summary), "rss": rss_growth(sampler, opts.soak_s)}


def rss_growth(sampler: Sampler, soak_s: float) -> dict[str, Any]:
    window = min(60.0, soak_s / 4)
    warmup = window
    first = [s for t, s in sampler.samples if warmup <= t < warmup + window]
    last = [s for t, s in sampler.samples if t >= soak_s - window]
    per: dict[str, Any] = {}
    for name in sampler.pids:
        a = _mean([s[name] for s in first])
        b = _mean([s[name] for s in last])
        growth = round((b - a) / a * 100, 2) if a else None
        per[name] = {
            "first_mib": round(a / 1024, 1),
            "last_mib": round(b / 1024, 1),
            "growth_pct": growth,
        }
    checked = [v["growth_pct"] for n, v in per.items() if n not in DATA_STORES]
    worst = max((g for g in checked if g is not None), default=0.0)
    return {
        "window_s": window,
        "warmup_s": warmup,
        "samples": len(sampler.samples),
        "per_process": per,
        "max_growth_pct": worst,
        "goal_pct": RSS_GOAL_PCT,
        "goal_excludes": DATA_STORES,
        "met": worst <= RSS_GOAL_PCT,
        "series_mib": [
            {"t": round(t, 1), **{n: round(v / 1024, 1) for n, v in s.items()}}
            for t, s in sampler.samples
        ],
    }


def _mean(values: list[int]) -> float:
    return sum(values) / len(values) if values else 0.0


def stack_config(run_dir: Path) -> StackConfig:
    config = StackConfig.from_env(ROOT, {**os.environ, "LLM_RUN_DIR": str(run_dir)})
    replicas = catalogue.local_replicas(config.models_config)
    return dataclasses.replace(
        config.with_ports(free_ports(tuple(r.port for r in replicas))),
        redis_prefix=f"benchload{os.getpid()}:",
        log_level="WARNING",  # per-request access logs would cost CPU the benchmark measures
    )


def update_results(path: Path, entries: dict[str, Any]) -> None:
    """Read-modify-write of the shared results file under a lock, replaced atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            current = json.loads(path.read_text())
        except (OSError, ValueError):
            current = {}
        if not isinstance(current, dict):
            current = {}
        current.update(entries)
        temporary = path.with_suffix(".json.tmp")
        temporary.write_text(json.dumps(current, indent=2) + "\n")
        os.replace(temporary, path)


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def workload(opts: Options) -> dict[str, Any]:
    return {
        "model": MODEL,
        "rpc": "LLMService.ChatStream through the edge (gRPC), response cache bypassed",
        "prompt_words_mix": PROMPT_MIX,
        "max_tokens_mix": OUTPUT_MIX,
        "sampling": "temperature 0.8, seeded, ignore_eos",
        "slo": {"ttft_ms": opts.slo_ttft_ms, "tpot_ms": opts.slo_tpot_ms},
        "latency_from": "scheduled arrival time",
        "seed": opts.seed,
    }


async def measure(stack: Stack, key: str, opts: Options, replicas: int) -> None:
    client = Client(stack.endpoints.edge_http, key, opts.timeout_s)
    try:
        load = await load_phase(client, opts, replicas)
        if opts.soak_s > 0:
            base = load["saturation_rps"] or min(opts.rates)
            pids = {p.spec.name: p.pid for p in stack.processes() if p.pid is not None}
            await soak_phase(client, Sampler(pids), load, round(SOAK_SHARE * base, 3), opts)
    finally:
        await client.close()


async def load_phase(client: Client, opts: Options, replicas: int) -> dict[str, Any]:
    warm = await open_loop(client, random.Random(opts.seed + 2), 1.0, 5.0)
    results = await steps(client, opts)
    load = {
        "benchmark": "load",
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
        "generation_replicas": replicas,
        "workload": workload(opts),
        "warmup_requests": len(warm),
        "step_s": opts.step_s,
        "steps": results,
        **saturation(results),
        "sustained_rule": f"slo_attainment >= {SUSTAINED_SHARE}, errors <= {MAX_ERROR_RATE}, "
        f"in-flight in the last quarter <= {BACKLOG_GROWTH} x the second quarter + {BACKLOG_SLACK}",
        "saturation_rule": "highest sustained rate below the first two unsustained steps",
    }
    update_results(opts.out, {"load": load})
    plot(load, None, opts.out.parent / "load.png")
    return load


async def soak_phase(
    client: Client, sampler: Sampler, load: dict[str, Any], rate: float, opts: Options
) -> None:
    result = await soak(client, sampler, rate, opts)
    soaked = {
        "benchmark": "soak",
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
        "share_of_saturation": SOAK_SHARE,
        "duration_s": opts.soak_s,
        "rss_interval_s": opts.rss_interval_s,
        **result,
    }
    update_results(opts.out, {"soak": soaked})
    plot(load, soaked, opts.out.parent / "load.png")
    rss = soaked["rss"]
    summary = {"soak_rps": rate, "error_rate": soaked["error_rate"], **rss}
    print(json.dumps({k: summary[k] for k in ("soak_rps", "error_rate", "max_growth_pct", "met")}))


def plot(load: dict[str, Any], soaked: dict[str, Any] | None, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = 3 if soaked else 2
    fig, axes = plt.subplots(1, panels, figsize=(5.5 * panels, 4.2))
    _latency_panel(axes[0], load["steps"])
    _throughput_panel(axes[1], load["steps"])
    for ax in axes[:2]:
        if load["saturation_rps"]:
            ax.axvline(load["saturation_rps"], color="black", alpha=0.3)
    if soaked:
        _rss_panel(axes[2], soaked)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _latency_panel(ax: Any, steps_: list[dict[str, Any]]) -> None:
    rates = [s["offered_rps"] for s in steps_]
    lines = (("ttft_ms", "p50", "o-"), ("ttft_ms", "p99", "o--"), ("e2e_ms", "p50", "s-"))
    for metric, q, style in (*lines, ("e2e_ms", "p90", "s-."), ("e2e_ms", "p99", "s--")):
        values = [s[metric][q] for s in steps_]
        nan = float("nan")
        ax.plot(rates, [nan if v is None else v for v in values], style, label=f"{metric[:-3]} {q}")
    ax.set_yscale("log")
    ax.set_xlabel("offered load (requests/s)")
    ax.set_ylabel("ms from scheduled arrival")
    ax.set_title("latency vs offered load")
    ax.legend(fontsize=8)


def _throughput_panel(ax: Any, steps_: list[dict[str, Any]]) -> None:
    rates = [s["offered_rps"] for s in steps_]
    ax.plot(rates, rates, ":", color="grey", label="offered")
    answered = [s["throughput_rps"] for s in steps_]
    ax.plot(rates, answered, "o-", label="answered/s (arrivals of the step)")
    ax.plot(rates, [s["goodput_rps"] for s in steps_], "s-", label="goodput (SLO met)/s")
    ax.set_xlabel("offered load (requests/s)")
    ax.set_ylabel("requests/s")
    ax.set_title("throughput and goodput")
    ax.legend(fontsize=8, loc="upper left")
    errors = ax.twinx()
    error_pct = [s["error_rate"] * 100 for s in steps_]
    errors.plot(rates, error_pct, "x--", color="red")
    errors.set_ylim(0, max(5.0, *error_pct) * 1.1)
    errors.set_ylabel("errors %", color="red")


def _rss_panel(ax: Any, soaked: dict[str, Any]) -> None:
    rss = soaked["rss"]
    series = rss["series_mib"]
    for name in rss["per_process"]:
        ax.plot([p["t"] for p in series], [p[name] for p in series], label=name)
    ax.set_xlabel("soak time (s)")
    ax.set_ylabel("RSS (MiB)")
    ax.set_title(f"soak at {soaked['offered_rps']} req/s: max growth {rss['max_growth_pct']}%")
    ax.legend(fontsize=7)


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
