"""A checked JSON schema restated where xgrammar 0.2.9 enforces a keyword wrongly.

- minLength/maxLength: xgrammar's length-limited strings let raw control characters through
  (invalid JSON), so they become a pattern of {min,max} characters other than quote, backslash
  and control characters (such strings then hold no escapes).
- format date, time, date-time: it allows 31 November and 29 February of any year; ipv4: it
  allows leading zeros ("01.2.3.4", which validators reject as ambiguous). They become exact
  patterns (years 0001-9999, leap years included; upper-case T and Z; seconds 00-59 and at most
  nine fraction digits; a UTC offset is required, as RFC 3339 says).
- pattern: every optional group "(...)?" is written "(?:|...)" (see regex_scan).
"""

from __future__ import annotations

from typing import Any

from .regex_scan import parts
from .schema_check import LIST_KEYWORDS, MAP_KEYWORDS, ONE_KEYWORDS

_YEAR = "(?:[0-9]{3}[1-9]|[0-9]{2}[1-9]0|[0-9][1-9]00|[1-9]000)"
_MONTH_DAY = (
    "(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])"
    "|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
    "|02-(?:0[1-9]|1[0-9]|2[0-8]))"
)
_LEAP_DAY = (
    "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)-02-29"
)
_DATE = f"(?:{_YEAR}-{_MONTH_DAY}|{_LEAP_DAY})"
_TIME = (
    "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,9})?"
    "(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
)
_OCTET = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
FORMAT_PATTERNS = {
    "date": f"^{_DATE}$",
    "time": f"^{_TIME}$",
    "date-time": f"^{_DATE}T{_TIME}$",
    "ipv4": f"^{_OCTET}(?:\\.{_OCTET}){{3}}$",
}
_PLAIN_CHAR = '[^"\\\\\\x00-\\x1f]'


def enforceable(schema: Any) -> Any:
    """A rewritten copy of `schema` (already accepted by schema_check.check_schema)."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for keyword, value in schema.items():
        if keyword in ONE_KEYWORDS:
            out[keyword] = enforceable(value)
        elif keyword in LIST_KEYWORDS and isinstance(value, list):
            out[keyword] = [enforceable(sub) for sub in value]
        elif keyword == "patternProperties" and isinstance(value, dict):
            out[keyword] = {exact_groups(k): enforceable(sub) for k, sub in value.items()}
        elif keyword in MAP_KEYWORDS and isinstance(value, dict):
            out[keyword] = {name: enforceable(sub) for name, sub in value.items()}
        else:
            out[keyword] = value
    if out.get("format") in FORMAT_PATTERNS:
        out["pattern"] = FORMAT_PATTERNS[out.pop("format")]
    if "minLength" in out or "maxLength" in out:
        low, high = out.pop("minLength", 0), out.pop("maxLength", "")
        out["pattern"] = f"^{_PLAIN_CHAR}{{{low},{high}}}$"
    if isinstance(out.get("pattern"), str):
        out["pattern"] = exact_groups(out["pattern"])
    return out


def exact_groups(pattern: str) -> str:
    """`pattern` with each optional group "(...)?" written as the alternation "(|...)"."""
    chars = list(pattern)
    opens: list[int] = []  # where each open group's body starts
    items = list(parts(pattern))
    for index, part in enumerate(items):
        if part.kind == "open":
            opens.append(part.end)
        elif part.kind == "close" and opens:
            body = opens.pop()
            after = items[index + 1] if index + 1 < len(items) else None
            if after is not None and pattern[after.start : after.end] in ("?", "??"):
                chars[body] = "|" + chars[body]
                chars[after.start : after.end] = [""] * (after.end - after.start)
    return "".join(chars)
