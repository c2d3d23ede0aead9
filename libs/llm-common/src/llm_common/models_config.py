"""The models catalogue (infra/config/models.yaml) shared by the services that need model facts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from llm_common.config import ConfigError
from llm_common.tools.parsers import DEFAULT_PARSER, PARSERS

KINDS = ("generation", "embedding")
DISCOVERY_KINDS = ("static", "dns", "kubernetes", "file")


@dataclass(frozen=True, slots=True)
class Discovery:
    """How a deployment's replicas are found.

    `static`: the listed `replicas`. `dns`: every A/AAAA address of `service` (a headless
    Service name), re-resolved every `interval_s`, each at `port`; `nameserver` ("host:port")
    asks that server instead of the system resolver. `kubernetes`: the ready endpoints of the
    EndpointSlices of Service `service` in `namespace`, watched, each at `port`. `file`: the
    host:port lines of `path`, re-read every `interval_s` (`make scale` on a local stack).
    `weights_digest`, when set, is the digest every replica must report (else the first
    admitted replica's defines it).
    """

    kind: str = "static"
    service: str = ""
    port: int = 0
    namespace: str = "default"
    interval_s: float = 5.0
    nameserver: str = ""
    weights_digest: str = ""
    path: str = ""

    @property
    def dynamic(self) -> bool:
        return self.kind != "static"


@dataclass(frozen=True, slots=True)
class Deployment:
    """Where a model runs: a set of replicas with one backend in one region."""

    name: str
    backend: str = "torch"
    region: str = "local"
    weight: int = 100
    replicas: tuple[str, ...] = ()  # static discovery; the addresses found first otherwise
    discovery: Discovery = field(default_factory=Discovery)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One servable model and its limits."""

    name: str
    checkpoint: Path
    kind: str = "generation"
    aliases: tuple[str, ...] = ()
    context_length: int = 2048
    default_max_tokens: int = 256
    tier: str = "default"
    deployments: tuple[Deployment, ...] = field(default_factory=tuple)
    tool_parser: str = DEFAULT_PARSER  # how its output writes tool calls (llm_common.tools)


@dataclass(frozen=True, slots=True)
class ModelCatalog:
    """Models by canonical name, with alias resolution.

    `tiers` lists the price tiers cheapest first (models.yaml `tiers`); a tier that is not
    listed ranks after every listed one.
    """

    models: Mapping[str, ModelSpec]
    aliases: Mapping[str, str]
    tiers: tuple[str, ...] = ()

    def resolve(self, name: str) -> ModelSpec | None:
        """The model called `name` or aliased by it, or None."""
        canonical = self.aliases.get(name, name)
        return self.models.get(canonical)

    def names(self) -> list[str]:
        return sorted(self.models)

    def tier_rank(self, tier: str) -> int:
        """Position of `tier` in the price order (0 = cheapest); unlisted tiers rank last."""
        try:
            return self.tiers.index(tier)
        except ValueError:
            return len(self.tiers)


def load_catalog(path: Path, model_root: Path) -> ModelCatalog:
    """Parse models.yaml; relative checkpoints resolve against `model_root`."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"MODELS_CONFIG: cannot read {path}: {exc}") from exc
    entries = raw.get("models") if isinstance(raw, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"MODELS_CONFIG: {path} has no `models` list")
    specs = [_parse_model(entry, model_root) for entry in entries]
    return _index(specs, _parse_tiers(raw.get("tiers")))


def _parse_tiers(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(t, str) and t for t in value):
        raise ConfigError("MODELS_CONFIG: `tiers` must be a list of tier names, cheapest first")
    if len(set(value)) != len(value):
        raise ConfigError("MODELS_CONFIG: `tiers` lists a tier twice")
    return tuple(value)


def _parse_model(entry: Any, model_root: Path) -> ModelSpec:
    if not isinstance(entry, dict) or not entry.get("name") or not entry.get("checkpoint"):
        raise ConfigError(f"MODELS_CONFIG: each model needs `name` and `checkpoint`: {entry!r}")
    name = str(entry["name"])
    kind = str(entry.get("kind", "generation"))
    if kind not in KINDS:
        raise ConfigError(f"MODELS_CONFIG: model {name}: kind must be one of {KINDS}")
    checkpoint = Path(str(entry["checkpoint"]))
    spec = ModelSpec(
        name=name,
        checkpoint=checkpoint if checkpoint.is_absolute() else model_root / checkpoint,
        kind=kind,
        aliases=tuple(str(a) for a in entry.get("aliases") or ()),
        context_length=_positive(entry, "context_length", 2048, name),
        default_max_tokens=_positive(entry, "default_max_tokens", 256, name),
        tier=str(entry.get("tier", "default")),
        deployments=tuple(_parse_deployment(d, name) for d in entry.get("deployments") or ()),
        tool_parser=_tool_parser(entry, name),
    )
    if spec.kind == "generation" and spec.default_max_tokens >= spec.context_length:
        raise ConfigError(f"MODELS_CONFIG: model {name}: default_max_tokens >= context_length")
    return spec


def _parse_deployment(entry: Any, model: str) -> Deployment:
    if not isinstance(entry, dict) or not entry.get("name"):
        raise ConfigError(f"MODELS_CONFIG: model {model}: each deployment needs a `name`")
    name = str(entry["name"])
    return Deployment(
        name=name,
        backend=str(entry.get("backend", "torch")),
        region=str(entry.get("region", "local")),
        weight=int(entry.get("weight", 100)),
        replicas=tuple(str(r) for r in entry.get("replicas") or ()),
        discovery=_parse_discovery(entry, f"model {model}: deployment {name}"),
    )


def _parse_discovery(entry: Mapping[str, Any], where: str) -> Discovery:
    kind = str(entry.get("discovery", "static"))
    if kind not in DISCOVERY_KINDS:
        raise ConfigError(f"MODELS_CONFIG: {where}: discovery must be one of {DISCOVERY_KINDS}")
    found = Discovery(
        kind=kind,
        service=str(entry.get("service", "")),
        port=int(entry.get("port", 0)),
        namespace=str(entry.get("namespace", "default")),
        interval_s=float(entry.get("interval_s", 5.0)),
        nameserver=str(entry.get("nameserver", "")),
        weights_digest=str(entry.get("weights_digest", "")),
        path=str(entry.get("path", "")),
    )
    if kind == "file":
        if not found.path:
            raise ConfigError(f"MODELS_CONFIG: {where}: file discovery needs `path`")
    elif found.dynamic and (not found.service or not 0 < found.port < 65536):
        raise ConfigError(f"MODELS_CONFIG: {where}: {kind} discovery needs `service` and `port`")
    if found.interval_s <= 0:
        raise ConfigError(f"MODELS_CONFIG: {where}: interval_s must be positive")
    return found


def _tool_parser(entry: Mapping[str, Any], model: str) -> str:
    value = entry.get("tool_parser", DEFAULT_PARSER)
    if value not in PARSERS:
        raise ConfigError(
            f"MODELS_CONFIG: model {model}: tool_parser {value!r} must be one of {PARSERS}"
        )
    return str(value)


def _positive(entry: Mapping[str, Any], key: str, default: int, model: str) -> int:
    value = entry.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"MODELS_CONFIG: model {model}: {key} must be a positive integer")
    return value


def _index(specs: Sequence[ModelSpec], tiers: tuple[str, ...] = ()) -> ModelCatalog:
    models: dict[str, ModelSpec] = {}
    aliases: dict[str, str] = {}
    for spec in specs:
        for name in (spec.name, *spec.aliases):
            if name in models or name in aliases:
                raise ConfigError(f"MODELS_CONFIG: model name or alias {name!r} is used twice")
            aliases[name] = spec.name
        models[spec.name] = spec
    return ModelCatalog(models=models, aliases=aliases, tiers=tiers)
