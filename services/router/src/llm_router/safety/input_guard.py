"""The input guard: blocked phrases and patterns reject a prompt; personal data in it is
allowed, redacted or rejected per the tenant's policy."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from llm_common.errors import FieldViolation, InvalidArgument
from llm_router.safety import pii
from llm_router.safety.policies import InputPolicy


@dataclass(frozen=True, slots=True)
class Screened:
    """The texts to use from now on and what the guard did to them."""

    texts: tuple[str, ...]
    redacted: tuple[str, ...] = ()  # PII kinds replaced


def screen(texts: Sequence[str], policy: InputPolicy, field_of: Callable[[int], str]) -> Screened:
    """Apply `policy` to every text; INVALID_ARGUMENT naming the fields and rules that block.

    Error details name the rule, never the matched text (it is the user's content).
    """
    violations: list[FieldViolation] = []
    out: list[str] = []
    redacted: list[str] = []
    for i, text in enumerate(texts):
        for rule in policy.rules:
            if rule.pattern.search(text):
                violations.append(
                    FieldViolation(field_of(i), f"blocked by content policy rule {rule.id!r}")
                )
        if policy.pii == "allow":
            out.append(text)
            continue
        if policy.pii == "reject":
            kinds = sorted({f.kind for f in pii.find(text, policy.pii_kinds)})
            if kinds:
                violations.append(
                    FieldViolation(field_of(i), f"contains personal data ({', '.join(kinds)})")
                )
            out.append(text)
            continue
        clean, kinds_found = pii.redact(text, policy.pii_kinds)
        out.append(clean)
        redacted.extend(kinds_found)
    if violations:
        raise InvalidArgument(violations, "request blocked by content policy")
    return Screened(tuple(out), tuple(dict.fromkeys(redacted)))
