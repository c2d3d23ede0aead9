"""`make up MODEL=/path/to/checkpoint [MODEL_NAME=name]`: serve one's own checkpoint.

The checkpoint is validated (llm_stack.checkpoint), then this run gets its own catalogue and
price list in the run directory: the checkpoint as the generation model (aliases `demo` and
`default`, so `llmctl chat` and the banner's curl reach it) on the replica ports the catalogue
gives its first generation model, the catalogue's embedding models as they are, and a default
price. infra/config stays untouched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from llm_common.config import ConfigError
from llm_stack.catalogue import LOCAL_HOSTS, _load
from llm_stack.checkpoint import CheckpointFacts, validate
from llm_stack.config import StackConfig, free_ports

DEFAULT_REPLICAS = 2
# What demo-llama costs (infra/config/prices.yaml), per 1M tokens in micros.
DEFAULT_PRICE = {
    "input_micros_per_mtok": 150000,
    "cached_input_micros_per_mtok": 75000,
    "output_micros_per_mtok": 600000,
}
FIRST_PORT = 50054
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass(frozen=True, slots=True)
class OwnModel:
    """A checkpoint to serve in this run."""

    path: Path
    name: str
    replicas: int = DEFAULT_REPLICAS


def model_name(path: Path, name: str | None) -> str:
    chosen = name or path.resolve().name
    if not _NAME.match(chosen):
        raise ConfigError(f"MODEL_NAME {chosen!r}: letters, digits, '.', '_' and '-' only")
    return chosen


def _local_ports(model: dict[str, Any]) -> list[int]:
    ports = []
    for deployment in model.get("deployments") or ():
        for address in deployment.get("replicas") or ():
            host, _, port = str(address).rpartition(":")
            if host in LOCAL_HOSTS and port.isdigit():
                ports.append(int(port))
    return ports


def run_catalogue(source: Path, own: OwnModel, facts: CheckpointFacts) -> dict[str, Any]:
    """The catalogue of this run: the checkpoint first, then the embedding models."""
    raw = _load(source)
    generation = [m for m in raw["models"] if m.get("kind", "generation") == "generation"]
    others = [m for m in raw["models"] if m.get("kind", "generation") != "generation"]
    taken = {p for m in others for p in _local_ports(m)}
    ports = [p for g in generation for p in _local_ports(g)][: own.replicas]
    candidate = FIRST_PORT
    while len(ports) < own.replicas:
        if candidate not in taken and candidate not in ports:
            ports.append(candidate)
        candidate += 10
    clash = [m["name"] for m in others if own.name in (m["name"], *(m.get("aliases") or ()))]
    if clash:
        raise ConfigError(f"MODEL_NAME {own.name!r} is the embedding model {clash[0]}'s name")
    context = min(facts.context_length, 4096)
    entry = {
        "name": own.name,
        "aliases": ["demo", "default"],
        "kind": "generation",
        "checkpoint": str(own.path.resolve()),
        "context_length": context,
        "default_max_tokens": min(256, context // 2),
        "tier": "small",
        "tool_parser": "hermes",
        "deployments": [
            {
                "name": f"{own.name}-local",
                "backend": "torch",
                "region": "local",
                "weight": 100,
                "replicas": [f"127.0.0.1:{p}" for p in ports],
            }
        ],
    }
    return {**raw, "models": [entry, *others]}


def run_prices(source: Path, name: str) -> dict[str, Any]:
    """The price list with a default price for `name` unless it has one."""
    raw = yaml.safe_load(source.read_text(encoding="utf-8"))
    if not isinstance(raw, dict) or not isinstance(raw.get("prices"), list):
        raise ConfigError(f"PRICES_CONFIG: {source} has no `prices` list")
    if not any(p.get("model") == name for p in raw["prices"]):
        price = {"model": name, "effective_from": "2025-01-01T00:00:00Z", **DEFAULT_PRICE}
        raw["prices"] = [*raw["prices"], price]
    return raw


def _write(path: Path, header: str, data: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# {header}\n" + yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def with_own_model(config: StackConfig, own: OwnModel) -> tuple[StackConfig, CheckpointFacts]:
    """Validate the checkpoint (UnservableCheckpointError); point `config` at this run's
    catalogue and prices. With LLM_PORTS=free the replica ports are chosen anew."""
    facts = validate(own.path, own.replicas)
    folder = config.run_dir / "own-model"
    note = f"Written by llm_stack for `make up MODEL={own.path}`; infra/config is unchanged."
    models = _write(folder / "models.yaml", note, run_catalogue(config.models_config, own, facts))
    prices = _write(folder / "prices.yaml", note, run_prices(config.prices_config, own.name))
    updated = replace(config, models_config=models, prices_config=prices)
    if config.ports.replicas:  # free ports: the catalogue's replica ports changed
        from llm_stack.catalogue import local_replicas

        ports = free_ports(tuple(r.port for r in local_replicas(models)))
        updated = updated.with_ports(ports)
    return updated, facts


def sample_call(edge_http: str, name: str) -> str:
    """What the banner adds: an OpenAI-client call to the new model."""
    return f"""Your model {name} (aliases demo, default) is served. With the openai client:
  .venv/bin/python -c 'import os, openai; c = openai.OpenAI(base_url="http://{edge_http}/v1", \\
      api_key=os.environ["LLM_API_KEY"]); print(c.chat.completions.create(model="{name}", \\
      messages=[{{"role": "user", "content": "Hello"}}], max_tokens=32).choices[0].message.content)'
  or: .venv/bin/llmctl chat --model {name} "Hello"
"""
