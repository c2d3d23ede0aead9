"""bench_load's analysis of a step: percentiles, SLO attainment, backlog, the knee."""

from __future__ import annotations

import os
from typing import Any

from load_client import Outcome
from load_config import BACKLOG_GROWTH, BACKLOG_SLACK, MAX_ERROR_RATE, SUSTAINED_SHARE, Options


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
    early, late = mean(second), mean(last)
    growing = n >= 8 and late > BACKLOG_GROWTH * early + BACKLOG_SLACK
    return {"inflight_q2": round(early, 1), "inflight_q4": round(late, 1), "growing": growing}


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


def mean(values: list[int]) -> float:
    return sum(values) / len(values) if values else 0.0
