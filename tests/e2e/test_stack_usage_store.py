"""Through the edge with billing's usage store (SQLite, as `make up` configures it, or the
database of BILLING_DATABASE_URL when the tests run with it set): traffic
while the billing process is SIGKILLed (the supervisor restarts it, the router replays its
settles from its outbox); afterwards `usage_records` holds exactly one row per answered
request, with the tokens the clients were told, and reconciliation finds no difference.

The session's stack is not supervised (`make up` is), so the test restarts billing itself, as
the supervisor would, with the same command and environment; that process serves the rest of
the session and is stopped before the stack. Billing's request ids are the router's billing
ids, not the ids the clients see: rows and answers are compared as multisets of tokens."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
import sqlalchemy as sa

from llm_billing.usagedb import driver_url
from llmapi.llm.v1 import llm_service_pb2_grpc as pb_grpc

from .conftest import RunningStack
from .test_stack_grpc import bearer, chat_request

pytestmark = pytest.mark.e2e
TENANT = f"e2e-usage-{uuid.uuid4().hex[:8]}"  # a database may outlive the run
REQUESTS = 60


def billing_process(prefix: str) -> tuple[int, dict[str, str]]:
    """The stack's billing process (found by its key prefix) and its environment."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            raw = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"llm_billing" not in cmdline:
            continue
        env = dict(item.decode().split("=", 1) for item in raw if b"=" in item)
        if env.get("BILLING_KEY_PREFIX") == f"{prefix}billing:":
            return int(proc.name), env
    raise AssertionError("the stack's billing process was not found")


@pytest.fixture(scope="session")
def restarted() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Billing processes this module started; stopped at the end of the session (before the
    stack, which this fixture is set up after)."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def restart(env: dict[str, str], cwd: str, log: str) -> subprocess.Popen[bytes]:
    with Path(log).open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "llm_billing"], env=env, cwd=cwd, stdout=out, stderr=out
        )


def test_sigkilled_billing_loses_and_doubles_no_usage_row(
    stack: RunningStack, restarted: list[subprocess.Popen[bytes]]
) -> None:
    key = stack.create_key(tenant=TENANT, name="usage store", requests_per_minute=0)
    pid, env = billing_process(stack.prefix)
    cwd, log = os.readlink(f"/proc/{pid}/cwd"), os.readlink(f"/proc/{pid}/fd/1")
    url = env["BILLING_DATABASE_URL"]
    if "BILLING_DATABASE_URL" not in os.environ:
        assert url.startswith("sqlite:///")  # make up's default
    answered: list[tuple[int, int]] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        request = chat_request(f"usage store request {i}", max_tokens=4)
        with grpc.insecure_channel(stack.edge) as channel:
            try:
                replies = list(
                    pb_grpc.LLMServiceStub(channel).ChatStream(
                        request, metadata=bearer(key), timeout=60
                    )
                )
            except grpc.RpcError:
                return  # not answered: must not be billed either (checked by the count)
        final = replies[-1]
        with lock:
            answered.append((final.usage.prompt_tokens, final.usage.completion_tokens))

    with futures.ThreadPoolExecutor(4) as pool:
        jobs = [pool.submit(one, i) for i in range(REQUESTS)]
        started = time.monotonic()
        while len(answered) < REQUESTS // 3:
            assert time.monotonic() - started < 120, "no traffic got through"
            time.sleep(0.05)
        os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
        restarted.append(restart(env, cwd, log))  # as the supervisor of `make up` does
        for job in jobs:
            job.result()
    assert len(answered) >= REQUESTS // 2

    deadline = time.monotonic() + 90  # router outbox replay, then billing's drain
    engine = sa.create_engine(driver_url(url))
    query = sa.text(
        "SELECT request_id, prompt_tokens, completion_tokens, status"
        " FROM usage_records WHERE tenant_id = :tenant"
    )
    try:
        while True:
            with engine.connect() as conn:
                rows = conn.execute(query, {"tenant": TENANT}).all()
            if len(rows) >= len(answered) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    finally:
        engine.dispose()
    assert len({r[0] for r in rows}) == len(rows) == len(answered)
    assert sorted((r[1], r[2]) for r in rows) == sorted(answered)
    assert sum(r[1] + r[2] for r in rows) == sum(p + c for p, c in answered)
    assert {r[3] for r in rows} <= {"settled", "corrected"}
    result = subprocess.run(
        [sys.executable, "-m", "llm_billing", "reconcile", "--tenant", TENANT, "--hours", "2"],
        env=env | {"METRICS_PORT": "off", "GRPC_PORT": "0"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert " 0 differences" in result.stdout
