"""response_format and vLLM's guided_* / structured_outputs -> SamplingParams.format."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from llm_router.api.openai_http.errors import invalid
from llm_router.api.openai_http.values import Payload, compact_json, flag, obj, text
from llmapi.common.v1 import common_pb2

MAX_CHOICES = 256
_SCHEMA_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
# The keys of vLLM's structured_outputs object, one of which is set.
_STRUCTURED_KEYS = ("json", "regex", "choice", "grammar", "json_object")


@dataclass(frozen=True, slots=True)
class FormatSource:
    """Where a format came from (the parameter named in errors) and what it asks."""

    param: str
    format: common_pb2.OutputFormat


def output_format(payload: Payload) -> common_pb2.OutputFormat | None:
    """The one output constraint of a request, if any; two at once is a 400."""
    found = [
        source
        for source in (
            _response_format(payload),
            *_guided(payload),
            _structured_outputs(payload),
        )
        if source is not None
    ]
    if len(found) > 1:
        names = ", ".join(s.param for s in found)
        raise invalid(f"only one output format may be given (got {names})", found[1].param)
    return found[0].format if found else None


def _response_format(payload: Payload) -> FormatSource | None:
    raw = obj(payload, "response_format")
    if raw is None:
        return None
    kind = raw.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return FormatSource("response_format", common_pb2.OutputFormat(json_object=True))
    if kind == "json_schema":
        return FormatSource("response_format", _json_schema_format(raw))
    raise invalid(
        "response_format.type must be text, json_object or json_schema", "response_format.type"
    )


def _json_schema_format(raw: Payload) -> common_pb2.OutputFormat:
    """{"name", "schema", "strict", "description"}: the schema travels as JSON text, unchanged.

    Output is always constrained to the schema, whether strict or not; without a schema
    any JSON object is accepted."""
    param = "response_format.json_schema"
    spec = obj(raw, "json_schema", param)
    if spec is None:
        raise invalid(f"{param} is required when type is json_schema", param)
    name = spec.get("name")
    if not isinstance(name, str) or not _SCHEMA_NAME.fullmatch(name):
        raise invalid(f"{param}.name must be 1-64 characters of [A-Za-z0-9_-]", f"{param}.name")
    text(spec, "description", f"{param}.description")
    flag(spec, "strict", f"{param}.strict")
    schema = obj(spec, "schema", f"{param}.schema")
    if schema is None:
        return common_pb2.OutputFormat(json_object=True)
    return common_pb2.OutputFormat(json_schema=compact_json(schema, f"{param}.schema"))


def _schema_text(value: Any, param: str) -> str:
    """A JSON schema given as an object or as JSON text."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise invalid(f"{param} must be a JSON schema (an object)", param) from None
    if not isinstance(value, dict):
        raise invalid(f"{param} must be a JSON schema (an object)", param)
    return compact_json(value, param)


def _pattern(value: Any, param: str) -> str:
    if not isinstance(value, str) or not value:
        raise invalid(f"{param} must be a non-empty string", param)
    return value


def _choices(value: Any, param: str) -> common_pb2.ChoiceFormat:
    if (
        not isinstance(value, list)
        or not 1 <= len(value) <= MAX_CHOICES
        or not all(isinstance(v, str) and v for v in value)
    ):
        raise invalid(f"{param} must be a list of 1-{MAX_CHOICES} non-empty strings", param)
    return common_pb2.ChoiceFormat(values=value)


def _one(key: str, value: Any, param: str) -> common_pb2.OutputFormat:
    """The format of one guided_* / structured_outputs entry: json, regex, grammar or choice."""
    if key == "json":
        return common_pb2.OutputFormat(json_schema=_schema_text(value, param))
    if key == "regex":
        return common_pb2.OutputFormat(regex=_pattern(value, param))
    if key == "grammar":
        return common_pb2.OutputFormat(grammar=_pattern(value, param))
    return common_pb2.OutputFormat(choice=_choices(value, param))


def _guided(payload: Payload) -> list[FormatSource]:
    """vLLM's guided_json, guided_regex, guided_choice and guided_grammar."""
    found = []
    for key in ("json", "regex", "choice", "grammar"):
        param = f"guided_{key}"
        value = payload.get(param)
        if value is not None:
            found.append(FormatSource(param, _one(key, value, param)))
    return found


def _structured_outputs(payload: Payload) -> FormatSource | None:
    """vLLM's structured_outputs object: one of json, regex, choice, grammar, json_object."""
    raw = obj(payload, "structured_outputs")
    if raw is None:
        return None
    given = [k for k in _STRUCTURED_KEYS if raw.get(k) not in (None, False)]
    if len(given) != 1:
        raise invalid(
            "structured_outputs must set exactly one of " + ", ".join(_STRUCTURED_KEYS),
            "structured_outputs",
        )
    key = given[0]
    param = f"structured_outputs.{key}"
    if key == "json_object":
        flag(raw, key, param)
        return FormatSource(param, common_pb2.OutputFormat(json_object=True))
    return FormatSource(param, _one(key, raw[key], param))
