"""`make scale REPLICAS=N`: add or remove local replicas of the first generation model on a
running stack. The run directory's catalogue lists that deployment's replicas in a file
(`discovery: file`), which the router re-reads, so replicas join and leave without a restart:
a new one is listed once it is SERVING (the router then probes it), one that goes is
unlisted first and stopped (drained) after the router has stopped choosing it."""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from llm_common.ports import free_port
from llm_stack import specs
from llm_stack.catalogue import LocalReplica
from llm_stack.process import ProcessSpec

REQUEST_FILE = "scale-request.json"
RESULT_FILE = "scale-result.json"
READ_INTERVAL_S = 0.5  # how often the router re-reads the replica file
UNLIST_WAIT_S = 2 * READ_INTERVAL_S + 0.5  # after this the router sends it nothing new


@dataclass(frozen=True, slots=True)
class Scalable:
    """The deployment `make scale` resizes and the file that lists its replicas."""

    model: str
    deployment: str
    listing: Path


@dataclass(frozen=True, slots=True)
class ScaleRequest:
    replicas: int
    id: str


def make_scalable(models_copy: Path, run_dir: Path) -> Scalable | None:
    """Switch the first generation deployment with local replicas to file discovery (in the
    run directory's copy only: the catalogue itself keeps its static addresses)."""
    raw: dict[str, Any] = yaml.safe_load(models_copy.read_text(encoding="utf-8"))
    for model in raw["models"]:
        if model.get("kind", "generation") != "generation":
            continue
        for deployment in model.get("deployments") or ():
            local = [a for a in deployment.get("replicas") or () if a.startswith("127.0.0.1:")]
            if not local:
                continue
            listing = run_dir / f"replicas-{deployment['name']}.txt"
            write_listing(listing, local)
            deployment.update(discovery="file", path=str(listing), interval_s=READ_INTERVAL_S)
            header = models_copy.read_text(encoding="utf-8").splitlines()[0]
            models_copy.write_text(f"{header}\n{yaml.safe_dump(raw, sort_keys=False)}", "utf-8")
            return Scalable(str(model["name"]), str(deployment["name"]), listing)
    return None


def write_listing(path: Path, addresses: list[str]) -> None:
    """Replace the replica file in one step: the router never reads half of it."""
    _replace(path, "".join(f"{a}\n" for a in addresses))


def extra_replica_spec(shared: specs.Shared, model: str) -> ProcessSpec:
    """A replica beyond the catalogue's, on free gRPC and metrics ports."""
    spec = specs.replica_spec(shared, LocalReplica(model, "generation", free_port()))
    metrics = free_port()
    return replace(spec, metrics_port=metrics, env={**spec.env, "METRICS_PORT": str(metrics)})


def request(run_dir: Path, replicas: int) -> ScaleRequest:
    """Ask the running supervisor to resize (it polls for the request)."""
    wanted = ScaleRequest(replicas, uuid.uuid4().hex)
    _replace(run_dir / REQUEST_FILE, json.dumps({"replicas": replicas, "id": wanted.id}))
    return wanted


def take_request(run_dir: Path) -> ScaleRequest | None:
    """The pending request, removed; None when there is none (or it is unreadable)."""
    path = run_dir / REQUEST_FILE
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        path.unlink()
        return ScaleRequest(int(raw["replicas"]), str(raw["id"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_result(run_dir: Path, done: ScaleRequest, addresses: list[str], error: str) -> None:
    result = {"id": done.id, "replicas": len(addresses), "addresses": addresses, "error": error}
    _replace(run_dir / RESULT_FILE, json.dumps(result))


def read_result(run_dir: Path, wanted: ScaleRequest) -> dict[str, Any] | None:
    try:
        raw: dict[str, Any] = json.loads((run_dir / RESULT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return raw if raw.get("id") == wanted.id else None


def _replace(path: Path, text: str) -> None:
    temporary = path.with_suffix(path.suffix + ".tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)
