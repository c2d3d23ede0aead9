"""Scenario (a): an inference replica killed with SIGKILL under streaming load, then restarted.

Streams not yet producing on the victim complete elsewhere; streams it was producing move to
the survivor mid-stream (the router resumes them there) and complete too, billed exactly the
tokens the client saw; Envoy ejects the replica, and after a restart it takes traffic again."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from .conftest import ChaosStack
from .harness import StreamOutcome, chat_stream, ledger, metric_sum, record, until, until_equal
from .replicas import WORKERS, envoy_excludes, generation_replicas, generations_served, until_served

pytestmark = pytest.mark.chaos

STREAM_TOKENS = 48
STREAMS_AFTER_KILL = 2  # per worker, all sent once the victim is dead
MIDSTREAM_TIMEOUT_S = 60.0
LEDGER_TIMEOUT_S = 30.0


def _mid_output(stack: ChaosStack, replica: str) -> bool:
    """A request running on `replica` has produced tokens: the running batch has fewer left
    to generate than its requests' max_tokens (only the load's streams run there now)."""
    address = stack.metrics(replica)
    running = metric_sum(address, "vllm:num_requests_running")
    remaining = metric_sum(address, "llm_inference_running_remaining_tokens")
    return running > 0 and remaining < running * STREAM_TOKENS


class _Load:
    """WORKERS threads streaming back to back: until the kill, then STREAMS_AFTER_KILL more."""

    def __init__(self, stack: ChaosStack, channel: grpc.Channel, key: str) -> None:
        self._stack, self._channel, self._key = stack, channel, key
        self.killed = threading.Event()
        self.before: list[StreamOutcome] = []  # started before the kill
        self.after: list[StreamOutcome] = []  # started after it
        self._lock = threading.Lock()

    def worker(self, index: int) -> None:
        after = 0
        while after < STREAMS_AFTER_KILL:
            late = self.killed.is_set()
            text = f"replica kill {index} {uuid.uuid4().hex}"
            outcome = chat_stream(self._channel, self._key, text, STREAM_TOKENS)
            with self._lock:
                (self.after if late else self.before).append(outcome)
            after += late


def test_killed_replica_fails_over_bills_and_rejoins(chaos_stack: ChaosStack) -> None:
    survivor, victim = generation_replicas(chaos_stack)[:2]
    process = chaos_stack.process(victim)
    tenant = f"chaos-replica-{uuid.uuid4().hex[:8]}"
    key = chaos_stack.create_key(tenant=tenant, name="replica kill", requests_per_minute=0)
    with grpc.insecure_channel(chaos_stack.edge) as channel:
        until_served(chaos_stack, channel, victim)  # both replicas take traffic before
        load = _Load(chaos_stack, channel, key)
        with ThreadPoolExecutor(WORKERS) as pool:
            futures = [pool.submit(load.worker, i) for i in range(WORKERS)]
            try:
                until(
                    "a stream mid-output on the victim",
                    lambda: _mid_output(chaos_stack, victim),
                    MIDSTREAM_TIMEOUT_S,
                )
                process.kill()  # SIGKILL: no drain, no goodbye
                killed_at = time.monotonic()
            finally:
                load.killed.set()
            for future in futures:
                future.result()
        load_s = time.monotonic() - killed_at
        streams = load.before + load.after

        codes = Counter(f"{o.code}/{o.finish}" for o in streams)
        # Sent after the kill: none had started on the victim, so each completes elsewhere.
        for outcome in load.after:
            assert (outcome.code, outcome.finish) == ("OK", "LENGTH"), dict(codes)
            assert outcome.received_tokens == STREAM_TOKENS
        # In flight at the kill: the ones the victim was producing resume on the survivor
        # (mid-stream migration), so every stream completes, its usage what was streamed.
        interrupted = [o for o in load.before if o.interrupted]
        for outcome in load.before:
            assert (outcome.code, outcome.finish) == ("OK", "LENGTH"), dict(codes)
            assert outcome.completion_tokens == outcome.received_tokens == STREAM_TOKENS, outcome
        migrated = metric_sum(
            chaos_stack.metrics("router"), "llm_router_migrations_total", outcome="resumed"
        )
        assert migrated >= 1, f"no stream was cut off by the kill: {dict(codes)}"
        assert generations_served(chaos_stack, survivor) > 0

        expected = _expected_bill(streams)
        ledger_s = until_equal(
            f"ledger equals the tokens the clients received (interrupted: {interrupted})",
            lambda: ledger(chaos_stack.edge, chaos_stack.admin_key, tenant),
            expected,
            LEDGER_TIMEOUT_S,
        )

        eject_s = until(
            "envoy excludes the killed replica",
            lambda: envoy_excludes(chaos_stack, process.spec.grpc_port),
            15,
        )
        process.start()
        restart_at = time.monotonic()
        chaos_stack.wait_serving(victim)
        chaos_stack.wait_envoy_healthy("inference", 60)
        rejoin_requests = until_served(chaos_stack, channel, victim)
        rejoin_s = time.monotonic() - restart_at
        assert not envoy_excludes(chaos_stack, process.spec.grpc_port)
    # Nothing is billed twice once everything has settled.
    assert ledger(chaos_stack.edge, chaos_stack.admin_key, tenant) == expected

    record(
        "replica_kill",
        {
            "streams": len(streams),
            "streams_before_kill": len(load.before),
            "streams_after_kill": len(load.after),
            "outcomes": dict(codes),
            "interrupted_streams": len(interrupted),
            "migrated_streams": int(migrated),
            "interrupted_tokens_billed": sum(o.received_tokens for o in interrupted),
            # In flight at the kill and ended with a non-OK status: what the error said.
            "non_ok_stream_details": [o.detail for o in load.before if o.code != "OK"],
            "ledger_requests_prompt_completion": list(expected),
            "ledger_match_s": round(ledger_s, 2),
            "load_after_kill_s": round(load_s, 2),
            "ejected_within_s": round(eject_s, 2),
            "rejoin_after_restart_s": round(rejoin_s, 2),
            "rejoin_probe_requests": rejoin_requests,
        },
    )


def _expected_bill(streams: list[StreamOutcome]) -> tuple[int, int, int]:
    """What the ledger must hold: one request per stream that produced output, with the
    prompt its usage reported and the tokens the client counted."""
    billed = [o for o in streams if o.received_tokens > 0]
    assert all(o.prompt_tokens > 0 for o in billed), "a stream ended without its usage"
    return (
        len(billed),
        sum(o.prompt_tokens for o in billed),
        sum(o.received_tokens for o in billed),
    )
