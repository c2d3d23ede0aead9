"""A replica that reports `draining` gets no new requests, even when it is the least loaded,
until it reports otherwise (a replica restarted at the same address)."""

from __future__ import annotations

import random

from llm_router.routing.load import Health, LoadBoard, LoadSnapshot
from llm_router.routing.prefix import AffinityTable
from llm_router.routing.selection import Job, ReplicaSelector
from llm_router.routing.settings import RoutingSettings

from .conftest import ManualClock


def test_a_draining_replica_is_never_chosen(clock: ManualClock) -> None:
    board = LoadBoard(exclude_s=5, exclude_max_s=60, stale_s=5, clock=clock)
    affinity = AffinityTable(max_entries=100, ttl_s=600, clock=clock)
    selector = ReplicaSelector(board, affinity, RoutingSettings(), random.Random(1))
    job = Job("dep", (), 10, 10)
    board.report("idle:1", LoadSnapshot(max_num_seqs=8, draining=True))
    board.report(
        "busy:1", LoadSnapshot(max_num_seqs=8, num_running=6, running_remaining_tokens=900)
    )
    assert board.health("idle:1") == Health.DRAINING
    picks = {selector.choose(job, ["idle:1", "busy:1"]) for _ in range(20)}
    assert {p.replica for p in picks if p is not None} == {"busy:1"}
    assert selector.choose(job, ["idle:1"]) is None
    board.lost("idle:1")  # its stream ended (the process exited): still not usable
    assert board.health("idle:1") == Health.DRAINING
    board.report("idle:1", LoadSnapshot(max_num_seqs=8))  # back, restarted
    assert board.health("idle:1") == Health.FRESH
    chosen = selector.choose(job, ["idle:1", "busy:1"])
    assert chosen is not None
    assert chosen.replica == "idle:1"
