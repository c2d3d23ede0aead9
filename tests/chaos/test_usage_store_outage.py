"""Billing's usage store (PostgreSQL) stopped for 30 s under load through the edge: no request
fails because of it, the usage waits in billing's Redis outbox (the backlog gauge rises) and
drains when the database is back, the store then holds one row per answered request with the
tokens the clients were told, and reconciliation reports no difference.

The database is a private PostgreSQL of this test (initdb + pg_ctl on a free port, from
services/billing/tests/integration/pg.py), so stopping it disturbs nobody; billing is restarted
onto it and back onto the stack's own store afterwards."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType

import grpc
import pytest
import sqlalchemy as sa

from .conftest import REPO, ChaosStack
from .harness import Outcome, chat, metric_sum, record, until

pytestmark = pytest.mark.chaos

OUTAGE_S = 30.0  # the figure
WORKERS = 2
BACKLOG = "llm_billing_usage_outbox_backlog"


def _pg_helpers() -> ModuleType:
    path = REPO / "services/billing/tests/integration/pg.py"
    spec = importlib.util.spec_from_file_location("billing_test_pg", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_usage_store_down_30s_under_load(chaos_stack: ChaosStack) -> None:
    pg = _pg_helpers()
    billing = chaos_stack.process("billing")
    original = billing.spec.env.get("BILLING_DATABASE_URL")
    tenant = f"chaos-usage-{uuid.uuid4().hex[:8]}"
    key = chaos_stack.create_key(tenant=tenant, name="usage store outage", requests_per_minute=0)
    metrics = chaos_stack.metrics("billing")
    with pg.private_postgres() as server, pg.scratch_database(server.server) as url:
        chaos_stack.restart(
            "billing",
            {"BILLING_DATABASE_URL": url, "BILLING_OUTBOX_INTERVAL_S": "0.2",
             "BILLING_DATABASE_TIMEOUT_S": "1"},
        )  # fmt: skip
        try:
            figures = _outage(chaos_stack, server, key, metrics, url, tenant)
        finally:
            chaos_stack.restart("billing", {"BILLING_DATABASE_URL": original})
    record("usage_store_db_outage", figures)


def _outage(
    chaos_stack: ChaosStack, server: object, key: str, metrics: str, url: str, tenant: str
) -> dict[str, object]:
    outcomes: list[Outcome] = []
    stop = threading.Event()
    lock = threading.Lock()
    peak = 0.0

    def worker(index: int) -> None:
        with grpc.insecure_channel(chaos_stack.edge) as channel:
            while not stop.is_set():
                outcome = chat(channel, key, f"usage store outage {index} {uuid.uuid4().hex}")
                with lock:
                    outcomes.append(outcome)

    with ThreadPoolExecutor(WORKERS) as pool:
        jobs = [pool.submit(worker, i) for i in range(WORKERS)]
        until("traffic", lambda: len(outcomes) >= 10, 60)
        server.stop("fast")  # type: ignore[attr-defined]
        down_at = time.monotonic()
        while time.monotonic() - down_at < OUTAGE_S:
            peak = max(peak, metric_sum(metrics, BACKLOG))
            time.sleep(0.5)
        server.start()  # type: ignore[attr-defined]
        time.sleep(5.0)  # load goes on while the backlog drains
        stop.set()
        for job in jobs:
            job.result()
    failed = [o.code for o in outcomes if o.code != "OK"]
    assert not failed, f"{len(failed)} requests failed: {sorted(set(failed))}"
    assert peak > 0, "the backlog gauge never rose while the database was down"
    drained_s = until("backlog drained", lambda: metric_sum(metrics, BACKLOG) == 0, 60)

    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    query = sa.text(
        "SELECT count(*), count(DISTINCT request_id), sum(prompt_tokens),"
        " sum(completion_tokens) FROM usage_records WHERE tenant_id = :t"
    )
    rows: tuple[int, ...] = (0, 0, 0, 0)

    def complete() -> bool:
        nonlocal rows
        with engine.connect() as conn:
            found = conn.execute(query, {"t": tenant}).one()
        rows = tuple(int(v or 0) for v in found)
        return rows[0] >= len(outcomes)

    try:
        until("every answered request in the store", complete, 60)
    finally:
        engine.dispose()
    answered = len(outcomes)
    assert rows == (
        answered,
        answered,
        sum(o.prompt_tokens for o in outcomes),
        sum(o.completion_tokens for o in outcomes),
    )
    env = dict(chaos_stack.process("billing").spec.env) | {"METRICS_PORT": "off"}
    result = subprocess.run(
        [sys.executable, "-m", "llm_billing", "reconcile", "--tenant", tenant, "--hours", "2"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return {
        "outage_s": OUTAGE_S,
        "requests": answered,
        "failed": 0,
        "backlog_peak": peak,
        "drain_after_recovery_s": round(drained_s, 2),
        "reconcile": result.stdout.strip().splitlines()[0],
    }
