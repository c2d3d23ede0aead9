"""The run directory's state file: who is running, under which pid, where its log is."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

STATE_FILE = "state.json"


@dataclass(frozen=True, slots=True)
class ProcessRecord:
    name: str
    pid: int
    command: str  # a fragment of its command line, checked before signalling the pid
    log: str
    grpc_port: int | None = None
    metrics_port: int | None = None
    health_service: str = ""


@dataclass(frozen=True, slots=True)
class StackState:
    supervisor_pid: int
    started_at: str
    endpoints: dict[str, str] = field(default_factory=dict)
    processes: list[ProcessRecord] = field(default_factory=list)


def state_path(run_dir: Path) -> Path:
    return run_dir / STATE_FILE


def write_state(run_dir: Path, state: StackState) -> None:
    path = state_path(run_dir)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(state), indent=2), encoding="utf-8")
    os.replace(tmp, path)


def read_state(run_dir: Path) -> StackState | None:
    try:
        raw: dict[str, Any] = json.loads(state_path(run_dir).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    processes = [ProcessRecord(**p) for p in raw.get("processes", [])]
    return StackState(
        supervisor_pid=int(raw["supervisor_pid"]),
        started_at=str(raw.get("started_at", "")),
        endpoints=dict(raw.get("endpoints", {})),
        processes=processes,
    )


def clear_state(run_dir: Path) -> None:
    state_path(run_dir).unlink(missing_ok=True)
