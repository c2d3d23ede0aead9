"""Scenario (b): billing down for 60 s under load. Every request is served (the fail-open
admission policy), usage is spooled to the router's outbox, the outbox drains once billing is
back, and the ledger equals the usage counted independently from the replies."""

from __future__ import annotations

import sqlite3
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from .conftest import ChaosStack
from .harness import Outcome, chat, ejections, ledger, metric_sum, record, until

pytestmark = pytest.mark.chaos

OUTAGE_S = 60.0  # the figure
WORKERS = 2
SPOOL_TIMEOUT_S = 15.0
# An item first tried at the outage's start is retried after 0.5, 1, 2, ... 32, then 60 s
# (+0.5 s jitter), so the last retry of a 60 s outage may come a minute after recovery.
DRAIN_TIMEOUT_S = 100.0
SETTLED_WINDOW_S = 3.0  # a replay still in flight would double-count within this
OUTBOX_FILE = "billing-outbox.sqlite3"


def _outbox_depth(path: Path) -> tuple[int, int]:
    """(live, dead) messages in the router's outbox, read without disturbing it."""
    if not path.exists():
        return 0, 0
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5) as db:
        live, dead = db.execute(
            "SELECT COALESCE(SUM(dead = 0), 0), COALESCE(SUM(dead != 0), 0) FROM outbox"
        ).fetchone()
    return int(live), int(dead)


class _Load:
    """WORKERS threads of back-to-back chats until stopped, sampling the outbox between."""

    def __init__(self, stack: ChaosStack, channel: grpc.Channel, key: str, outbox: Path) -> None:
        self._stack, self._channel, self._key, self._outbox = stack, channel, key, outbox
        self.stop = threading.Event()
        self.outcomes: list[Outcome] = []
        self.depth_peak = 0
        self._lock = threading.Lock()

    def worker(self, index: int) -> None:
        while not self.stop.is_set():
            text = f"billing outage {index} {uuid.uuid4().hex}"
            outcome = chat(self._channel, self._key, text)
            depth = _outbox_depth(self._outbox)[0]
            with self._lock:
                self.outcomes.append(outcome)
                self.depth_peak = max(self.depth_peak, depth)


def test_billing_outage_loses_and_doubles_nothing(chaos_stack: ChaosStack) -> None:
    tenant = f"chaos-billing-{uuid.uuid4().hex[:8]}"
    key = chaos_stack.create_key(tenant=tenant, name="billing outage", requests_per_minute=0)
    router = chaos_stack.metrics("router")
    outbox = chaos_stack.stack.config.run_dir / "router-outbox" / OUTBOX_FILE
    billing = chaos_stack.process("billing")

    def spooled() -> float:
        return metric_sum(router, "llm_router_settlements_total", outcome="spooled")

    spooled_before = spooled()
    ejected_before = ejections(chaos_stack.stack.endpoints.admin, "billing")
    billing.kill()  # SIGKILL: no drain
    down_at = time.monotonic()
    try:
        with grpc.insecure_channel(chaos_stack.edge) as channel:
            load = _Load(chaos_stack, channel, key, outbox)
            with ThreadPoolExecutor(WORKERS) as pool:
                futures = [pool.submit(load.worker, i) for i in range(WORKERS)]
                # The outage lasts OUTAGE_S whatever the load does; this is its clock.
                load.stop.wait(OUTAGE_S)
                load.stop.set()
                for future in futures:
                    future.result()
        outcomes = load.outcomes
        assert ledger(chaos_stack.edge, chaos_stack.admin_key, tenant) is None  # still down
        codes = Counter(o.code for o in outcomes)
        assert codes == {"OK": len(outcomes)}, dict(codes)  # fail-open: all served
        # Settlement runs after the answer: each one lands in the outbox shortly after.
        until(
            "usage spooled to the outbox",
            lambda: spooled() - spooled_before >= len(outcomes),
            SPOOL_TIMEOUT_S,
        )
        depth_peak = max(load.depth_peak, _outbox_depth(outbox)[0])
    finally:
        billing.start()
    outage_s = time.monotonic() - down_at
    chaos_stack.wait_serving("billing", 60)
    recovered_at = time.monotonic()

    expected = (
        len(outcomes),
        sum(o.prompt_tokens for o in outcomes),
        sum(o.completion_tokens for o in outcomes),
    )

    def settled() -> bool:
        seen = ledger(chaos_stack.edge, chaos_stack.admin_key, tenant)
        if seen is not None:  # never more than was served, at any moment
            assert seen[0] <= expected[0], f"billed more requests than were served: {seen}"
        return seen == expected and _outbox_depth(outbox)[0] == 0

    drain_s = until("outbox drained into the ledger", settled, DRAIN_TIMEOUT_S)
    assert _outbox_depth(outbox) == (0, 0)  # nothing dead-lettered
    # Still equal a moment later: no replay still in flight lands a second time.
    time.sleep(SETTLED_WINDOW_S)
    assert ledger(chaos_stack.edge, chaos_stack.admin_key, tenant) == expected

    record(
        "billing_down",
        {
            "outage_s": round(outage_s, 1),
            "workers": WORKERS,
            "requests": len(outcomes),
            "codes": dict(codes),
            "outbox_depth_peak": depth_peak,
            "drain_after_recovery_s": round(drain_s, 1),
            "billing_restart_s": round(recovered_at - down_at - outage_s, 1),
            "ledger_requests_prompt_completion": list(expected),
            "envoy_billing_ejections": ejections(chaos_stack.stack.endpoints.admin, "billing")
            - ejected_before,
            "mean_latency_s": round(sum(o.seconds for o in outcomes) / max(1, len(outcomes)), 3),
        },
    )
