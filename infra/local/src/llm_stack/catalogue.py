"""The inference replicas the catalogue places on this host, and the run directory's copy of it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from llm_common.config import ConfigError

LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost"})


@dataclass(frozen=True, slots=True)
class LocalReplica:
    """One inference process to start: a model on a catalogue port of this host."""

    model: str
    kind: str  # generation | embedding
    port: int  # as the catalogue lists it

    @property
    def name(self) -> str:
        return f"replica-{self.port}"


def _load(path: Path) -> dict[str, Any]:
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"MODELS_CONFIG: cannot read {path}: {exc}") from exc
    if not isinstance(raw, dict) or not isinstance(raw.get("models"), list):
        raise ConfigError(f"MODELS_CONFIG: {path} has no `models` list")
    return raw


def _split(address: str) -> tuple[str, int] | None:
    host, _, port = str(address).rpartition(":")
    return (host, int(port)) if port.isdigit() else None


def local_replicas(path: Path) -> list[LocalReplica]:
    """Every replica on 127.0.0.1/localhost, in catalogue order (generation models first)."""
    found: list[LocalReplica] = []
    for model in _load(path)["models"]:
        kind = str(model.get("kind", "generation"))
        for deployment in model.get("deployments") or ():
            for address in deployment.get("replicas") or ():
                parsed = _split(address)
                if parsed is not None and parsed[0] in LOCAL_HOSTS:
                    found.append(LocalReplica(str(model["name"]), kind, parsed[1]))
    ports = [r.port for r in found]
    if len(set(ports)) != len(ports):
        raise ConfigError(f"MODELS_CONFIG: {path} places two replicas on one local port")
    return sorted(found, key=lambda r: r.kind != "generation")


def generation_ports(replicas: list[LocalReplica]) -> tuple[int, ...]:
    """Catalogue ports of the first generation model's replicas (Envoy's balanced cluster)."""
    first = next((r.model for r in replicas if r.kind == "generation"), None)
    return tuple(r.port for r in replicas if r.model == first)


def write_copy(source: Path, target: Path, port_map: Mapping[int, int]) -> Path:
    """The catalogue with local replica ports replaced as the stack binds them."""
    raw = _load(source)
    for model in raw["models"]:
        for deployment in model.get("deployments") or ():
            deployment["replicas"] = [_moved(a, port_map) for a in deployment.get("replicas") or ()]
    target.parent.mkdir(parents=True, exist_ok=True)
    header = f"# Written by llm_stack from {source.name}; local replica ports as bound.\n"
    target.write_text(header + yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return target


def _moved(address: str, port_map: Mapping[int, int]) -> str:
    parsed = _split(address)
    if parsed is None or parsed[0] not in LOCAL_HOSTS:
        return address
    return f"127.0.0.1:{port_map.get(parsed[1], parsed[1])}"
