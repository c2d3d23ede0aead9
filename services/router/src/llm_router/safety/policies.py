"""Per-tenant policies from policies.yaml: admission, input rules and output rules."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from llm_common.config import ConfigError
from llm_router.safety import pii as pii_detect

PII_ACTIONS = ("allow", "redact", "reject")
BILLING_ACTIONS = ("admit", "reject")
SECTIONS = ("admission", "input", "output")
MAX_PHRASE_CHARS = 256
# Extra hold-back beyond the longest phrase: phrases match with any run of whitespace
# between their words, so a match can be a little longer than the phrase.
PHRASE_SLACK_CHARS = 16


@dataclass(frozen=True, slots=True)
class Rule:
    """A named pattern; `id` appears in errors and metrics, never the matched text."""

    id: str
    pattern: re.Pattern[str]


@dataclass(frozen=True, slots=True)
class AdmissionPolicy:
    """Who may use what, and what happens when billing cannot be reached."""

    billing_unavailable: str = "admit"  # admit: meter through the outbox; reject: UNAVAILABLE
    allowed_tiers: frozenset[str] = frozenset()  # empty: every tier


@dataclass(frozen=True, slots=True)
class InputPolicy:
    """Checks on the prompt before anything is tokenized or billed."""

    rules: tuple[Rule, ...] = ()
    pii: str = "allow"  # allow | redact | reject
    pii_kinds: tuple[str, ...] = pii_detect.KINDS


@dataclass(frozen=True, slots=True)
class OutputPolicy:
    """Checks on the generated stream: blocked phrases stop it, personal data is redacted."""

    phrases: tuple[Rule, ...] = ()
    redact: tuple[str, ...] = pii_detect.KINDS
    hold_back_chars: int = 0  # the window a phrase split across deltas must fit in


@dataclass(frozen=True, slots=True)
class TenantPolicy:
    admission: AdmissionPolicy = field(default_factory=AdmissionPolicy)
    input: InputPolicy = field(default_factory=InputPolicy)
    output: OutputPolicy = field(default_factory=OutputPolicy)


@dataclass(frozen=True, slots=True)
class PolicyBook:
    """The default policy and the tenants that override parts of it."""

    default: TenantPolicy = field(default_factory=TenantPolicy)
    tenants: Mapping[str, TenantPolicy] = field(default_factory=dict)

    def for_tenant(self, tenant: str) -> TenantPolicy:
        return self.tenants.get(tenant, self.default)


def phrase_pattern(phrase: str) -> re.Pattern[str]:
    """Case-insensitive, any whitespace between words, not inside a longer word."""
    words = phrase.split()
    body = r"\s+".join(re.escape(w) for w in words)
    return re.compile(rf"(?<!\w){body}(?!\w)", re.IGNORECASE)


def load_policies(path: Path) -> PolicyBook:
    """Parse policies.yaml; ConfigError naming the problem."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"ROUTER_POLICIES: cannot read {path}: {exc}") from exc
    return parse_policies(raw)


def parse_policies(raw: Any) -> PolicyBook:
    """A PolicyBook from the YAML structure (see infra/config/policies.yaml)."""
    if not isinstance(raw, dict):
        raise ConfigError("ROUTER_POLICIES: the document must be a mapping")
    default_raw = _mapping(raw.get("default"), "default")
    tenants_raw = _mapping(raw.get("tenants"), "tenants")
    default = _policy(default_raw, "default")
    tenants = {
        str(tenant): _policy(_merge(default_raw, _mapping(body, f"tenants.{tenant}")), str(tenant))
        for tenant, body in tenants_raw.items()
    }
    return PolicyBook(default=default, tenants=tenants)


def _merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    # A tenant overrides single keys of a section; unnamed keys keep the default's value.
    merged: dict[str, Any] = {}
    for section in SECTIONS:
        merged[section] = {
            **_mapping(base.get(section), section),
            **_mapping(override.get(section), section),
        }
    return merged


def _policy(raw: Mapping[str, Any], where: str) -> TenantPolicy:
    unknown = set(raw) - set(SECTIONS)
    if unknown:
        raise ConfigError(f"ROUTER_POLICIES: {where}: unknown sections {sorted(unknown)}")
    return TenantPolicy(
        admission=_admission(_mapping(raw.get("admission"), f"{where}.admission"), where),
        input=_input(_mapping(raw.get("input"), f"{where}.input"), where),
        output=_output(_mapping(raw.get("output"), f"{where}.output"), where),
    )


def _admission(raw: Mapping[str, Any], where: str) -> AdmissionPolicy:
    action = str(raw.get("billing_unavailable", "admit"))
    _one_of(action, BILLING_ACTIONS, f"{where}.admission.billing_unavailable")
    return AdmissionPolicy(
        billing_unavailable=action,
        allowed_tiers=frozenset(_strings(raw.get("allowed_tiers"), f"{where}.allowed_tiers")),
    )


def _input(raw: Mapping[str, Any], where: str) -> InputPolicy:
    action = str(raw.get("pii", "allow"))
    _one_of(action, PII_ACTIONS, f"{where}.input.pii")
    rules = [*_phrases(raw.get("blocklist"), f"{where}.input"), *_patterns(raw, where)]
    return InputPolicy(
        rules=tuple(rules), pii=action, pii_kinds=_kinds(raw.get("pii_kinds"), f"{where}.input")
    )


def _output(raw: Mapping[str, Any], where: str) -> OutputPolicy:
    phrases = _phrases(raw.get("blocklist"), f"{where}.output")
    longest = max((len(rule.id) for rule in phrases), default=0)
    return OutputPolicy(
        phrases=tuple(phrases),
        redact=_kinds(raw.get("redact"), f"{where}.output"),
        hold_back_chars=longest + PHRASE_SLACK_CHARS if phrases else 0,
    )


def _phrases(value: Any, where: str) -> list[Rule]:
    rules = []
    for phrase in _strings(value, f"{where}.blocklist"):
        if not phrase.strip() or len(phrase) > MAX_PHRASE_CHARS:
            raise ConfigError(
                f"ROUTER_POLICIES: {where}.blocklist: phrases must be 1-{MAX_PHRASE_CHARS} chars"
            )
        # The phrase is its own id: it is configuration, not user content.
        rules.append(Rule(id=phrase, pattern=phrase_pattern(phrase)))
    return rules


def _patterns(raw: Mapping[str, Any], where: str) -> list[Rule]:
    items = raw.get("patterns") or []
    if not isinstance(items, list):
        raise ConfigError(f"ROUTER_POLICIES: {where}.input.patterns must be a list")
    rules = []
    for item in items:
        if not isinstance(item, dict) or not item.get("id") or not item.get("regex"):
            raise ConfigError(f"ROUTER_POLICIES: {where}.input.patterns: need `id` and `regex`")
        try:
            pattern = re.compile(str(item["regex"]), re.IGNORECASE)
        except re.error as exc:
            raise ConfigError(f"ROUTER_POLICIES: {where}: pattern {item['id']}: {exc}") from exc
        rules.append(Rule(id=str(item["id"]), pattern=pattern))
    return rules


def _kinds(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return pii_detect.KINDS
    kinds = tuple(_strings(value, where))
    for kind in kinds:
        _one_of(kind, pii_detect.KINDS, f"{where} PII kind")
    return kinds


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"ROUTER_POLICIES: {where} must be a mapping")
    return value


def _strings(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"ROUTER_POLICIES: {where} must be a list of strings")
    return list(value)


def _one_of(value: str, allowed: tuple[str, ...], where: str) -> None:
    if value not in allowed:
        raise ConfigError(f"ROUTER_POLICIES: {where} must be one of {', '.join(allowed)}")
