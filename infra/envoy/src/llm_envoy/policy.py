"""Load and check `policy.yaml`: every error names its key and what is allowed there.

The schema is the dataclasses in `policy_model`: their fields are the allowed keys, their
types the allowed kinds, their `metadata` the ranges and choices. A section may give only
some keys; the rest keep their defaults (today's behaviour).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from llm_envoy.policy_model import MeshPolicy, ServiceTimeouts, UnaryRoute

VERSION = 1
# The repository's policy, next to this package's pyproject.
DEFAULT_POLICY_FILE = Path(__file__).resolve().parents[2] / "policy.yaml"
CLUSTER_NAMES = frozenset(
    {
        "auth",
        "tokenizer",
        "router",
        "inference",
        "cache",
        "billing",
        "router_http",
        "auth_edge",
        "auth_http",
        "inference_replica",
        "local_app",
        "local_app_http",
        "local_authz_http",
        "envoy_admin",
        "otel_collector",
    }
)


class PolicyError(ValueError):
    """A policy that must not be applied; `problems` lists each key's complaint."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("invalid mesh policy:\n" + "\n".join(f"  {p}" for p in problems))
        self.problems = problems


def load_policy(path: Path = DEFAULT_POLICY_FILE) -> MeshPolicy:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise PolicyError([f"{path.name}: not YAML: {exc}"]) from exc
    return parse_policy({} if data is None else data)


def parse_policy(data: object) -> MeshPolicy:
    """The policy a YAML document describes, or PolicyError with every problem found."""
    errors: list[str] = []
    if not isinstance(data, Mapping):
        raise PolicyError(["(top level): expected a mapping"])
    body = dict(data)
    version = body.pop("version", VERSION)
    if version != VERSION:
        errors.append(f"version: {version!r} is not supported (allowed: {VERSION})")
    clusters = body.pop("clusters", {}) or {}
    policy: MeshPolicy = _build(MeshPolicy, body, "", errors, skip={"cluster_defaults", "clusters"})
    defaults_raw, overrides = _split_clusters(clusters, errors)
    defaults = _build(
        _field_type(MeshPolicy, "cluster_defaults"), defaults_raw, "clusters.defaults", errors
    )
    built = {}
    for name, raw in overrides.items():
        merged = _merge(dataclasses.asdict(defaults), raw)
        built[name] = _build(type(defaults), merged, f"clusters.{name}", errors)
    _check_relations(policy, defaults, built, errors)
    if errors:
        raise PolicyError(errors)
    return dataclasses.replace(
        policy, cluster_defaults=defaults, clusters=types.MappingProxyType(built)
    )


def _split_clusters(clusters: object, errors: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    if not isinstance(clusters, Mapping):
        errors.append("clusters: expected a mapping of `defaults` and cluster names")
        return {}, {}
    overrides = {}
    for name, raw in clusters.items():
        if name != "defaults" and name not in CLUSTER_NAMES:
            allowed = ", ".join(sorted(CLUSTER_NAMES))
            errors.append(f"clusters.{name}: unknown cluster (allowed: defaults, {allowed})")
        elif name != "defaults":
            overrides[name] = raw if isinstance(raw, Mapping) else {}
            if not isinstance(raw, Mapping):
                errors.append(f"clusters.{name}: expected a mapping")
    return dict(clusters.get("defaults") or {}), overrides


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _field_type(cls: type, name: str) -> Any:
    return typing.get_type_hints(cls)[name]


def _build(
    cls: Any,
    data: object,
    path: str,
    errors: list[str],
    skip: frozenset[str] | set[str] = frozenset(),
) -> Any:
    """`cls` from a (partial) mapping; problems go to `errors`, defaults fill the gaps."""
    if not isinstance(data, Mapping):
        errors.append(f"{path or '(top level)'}: expected a mapping, got {type(data).__name__}")
        return cls()
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in skip}
    values: dict[str, Any] = {}
    for key, raw in data.items():
        where = f"{path}.{key}" if path else str(key)
        if key not in fields:
            allowed = ", ".join(sorted([*fields, *(() if path else ("clusters", "version"))]))
            errors.append(f"{where}: unknown key (allowed: {allowed})")
            continue
        ok, value = _value(hints[key], fields[key], raw, where, errors)
        if ok:
            values[key] = value
    return cls(**values)


def _value(
    hint: Any, spec: dataclasses.Field[Any], raw: object, where: str, errors: list[str]
) -> tuple[bool, Any]:
    optional = _is_optional(hint)
    inner = _strip_none(hint)
    if raw is None:
        if optional:
            return True, None
        errors.append(f"{where}: must not be null")
        return False, None
    if dataclasses.is_dataclass(inner):
        return True, _build(inner, raw, where, errors)
    origin = typing.get_origin(inner)
    if origin is Mapping or origin is dict:
        return _services(raw, where, errors)
    if origin is tuple:
        return _choices_list(spec, raw, where, errors)
    return _scalar(inner, spec, raw, where, errors)


def _services(raw: object, where: str, errors: list[str]) -> tuple[bool, Any]:
    """mesh_routes.services: per dependency, merged over its built-in timeouts."""
    defaults = MeshPolicy().mesh_routes.services
    if not isinstance(raw, Mapping):
        errors.append(f"{where}: expected a mapping of service names")
        return False, None
    built = dict(defaults)
    for name, entry in raw.items():
        if name not in defaults:
            errors.append(
                f"{where}.{name}: unknown service (allowed: {', '.join(sorted(defaults))})"
            )
            continue
        merged = _merge(
            dataclasses.asdict(defaults[name]), entry if isinstance(entry, Mapping) else {}
        )
        built[name] = _build(
            ServiceTimeouts,
            merged if isinstance(entry, Mapping) else entry,
            f"{where}.{name}",
            errors,
        )
    return True, types.MappingProxyType(built)


def _choices_list(
    spec: dataclasses.Field[Any], raw: object, where: str, errors: list[str]
) -> tuple[bool, Any]:
    items = raw.split(",") if isinstance(raw, str) else raw
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        errors.append(f"{where}: expected a list of strings")
        return False, None
    allowed = spec.metadata["choices"]
    wrong = [i for i in items if i.strip() not in allowed]
    if wrong:
        errors.append(
            f"{where}: {', '.join(wrong)} not allowed (allowed: {', '.join(sorted(allowed))})"
        )
        return False, None
    return True, tuple(i.strip() for i in items)


def _scalar(
    kind: Any, spec: dataclasses.Field[Any], raw: object, where: str, errors: list[str]
) -> tuple[bool, Any]:
    if kind is bool:
        if not isinstance(raw, bool):
            errors.append(f"{where}: expected true or false, got {raw!r}")
            return False, None
        return True, raw
    numeric = isinstance(raw, (int, float)) and not isinstance(raw, bool)
    if not numeric or (kind is int and not isinstance(raw, int)):
        errors.append(
            f"{where}: expected {'an integer' if kind is int else 'a number'}, got {raw!r}"
        )
        return False, None
    value = kind(raw)
    if "choices" in spec.metadata and value not in spec.metadata["choices"]:
        allowed = ", ".join(str(c) for c in sorted(spec.metadata["choices"]))
        errors.append(f"{where}: {raw!r} not allowed (allowed: {allowed})")
        return False, None
    if "range" in spec.metadata:
        low, high = spec.metadata["range"]
        if not low <= value <= high:
            unit = " seconds" if where.endswith("_s") else (" %" if "percent" in where else "")
            errors.append(f"{where}: {raw!r} is out of range (allowed: {low:g} to {high:g}{unit})")
            return False, None
    return True, value


def _is_optional(hint: Any) -> bool:
    return isinstance(hint, types.UnionType) and type(None) in typing.get_args(hint)


def _strip_none(hint: Any) -> Any:
    if not _is_optional(hint):
        return hint
    (inner,) = [a for a in typing.get_args(hint) if a is not type(None)]
    return inner


def _check_relations(
    policy: MeshPolicy, defaults: Any, clusters: Mapping[str, Any], errors: list[str]
) -> None:
    """Checks across keys: a back-off cap below its base, a per-try timeout above the route's."""
    edge, mesh = policy.edge_routes, policy.mesh_routes
    retries = {
        "edge_routes.unary.retry": edge.unary.retry,
        "edge_routes.streaming.retry": edge.streaming.retry,
        "edge_routes.generation.retry": edge.generation.retry,
        "edge_routes.admin.retry": edge.admin.retry,
        "mesh_routes.unary_retry": mesh.unary_retry,
        "mesh_routes.streaming.retry": mesh.streaming.retry,
        "mesh_routes.generation.retry": mesh.generation.retry,
    }
    for where, retry in retries.items():
        if retry.backoff_max_s < retry.backoff_base_s:
            errors.append(
                f"{where}.backoff_max_s: {retry.backoff_max_s:g} is below "
                f"backoff_base_s {retry.backoff_base_s:g}"
            )
    unary: dict[str, UnaryRoute | ServiceTimeouts] = {
        "edge_routes.unary": edge.unary,
        "edge_routes.admin": edge.admin,
    }
    unary |= {f"mesh_routes.services.{n}": t for n, t in mesh.services.items()}
    for where, route in unary.items():
        if route.per_try_timeout_s > route.timeout_s:
            errors.append(
                f"{where}.per_try_timeout_s: {route.per_try_timeout_s:g} exceeds "
                f"timeout_s {route.timeout_s:g}"
            )
    for name, cluster in {"defaults": defaults, **clusters}.items():
        od = cluster.outlier_detection
        if od.max_ejection_time_s < od.base_ejection_time_s:
            errors.append(
                f"clusters.{name}.outlier_detection.max_ejection_time_s: below base_ejection_time_s"
            )
