"""--json-schema, --tool, --tool-choice, --n and --top-logprobs -> request fields."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from llmapi.common.v1 import common_pb2
from llmctl.connection import UsageError

_MODES = {
    "none": common_pb2.TOOL_CHOICE_MODE_NONE,
    "auto": common_pb2.TOOL_CHOICE_MODE_AUTO,
    "required": common_pb2.TOOL_CHOICE_MODE_REQUIRED,
}


def add_arguments(parser: argparse.ArgumentParser, chat: bool) -> None:
    parser.add_argument(
        "--json-schema",
        type=Path,
        metavar="FILE",
        help="answer JSON matching this JSON schema file (or an OpenAI json_schema object)",
    )
    parser.add_argument("--n", type=int, help="independent answers (1-16)")
    parser.add_argument(
        "--top-logprobs", type=int, metavar="K", help="print token logprobs and K alternatives"
    )
    if not chat:
        return
    parser.add_argument(
        "--tool",
        type=Path,
        action="append",
        default=[],
        metavar="FILE",
        help="a function the model may call: {name, description, parameters} or an OpenAI "
        "tool object (repeatable)",
    )
    parser.add_argument(
        "--tool-choice", metavar="auto|required|none|NAME", help="how tools may be used"
    )


def apply_sampling(args: argparse.Namespace, params: common_pb2.SamplingParams) -> None:
    if args.json_schema is not None:
        params.format.json_schema = _dumps(_schema(_load(args.json_schema)))
    if args.n is not None:
        params.n = args.n
    if args.top_logprobs is not None:
        params.logprobs = True
        params.top_logprobs = args.top_logprobs


def tool_fields(args: argparse.Namespace) -> dict[str, Any]:
    """tools and tool_choice of a ChatRequest."""
    tools = [tool for path in args.tool for tool in _tools(path)]
    fields: dict[str, Any] = {"tools": tools}
    if args.tool_choice is not None:
        fields["tool_choice"] = _tool_choice(args.tool_choice, [t.function.name for t in tools])
    return fields


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise UsageError(f"{path} is not JSON: {exc}") from None


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _schema(loaded: Any) -> Any:
    """A JSON schema, or OpenAI's {"type": "json_schema", "json_schema": {"schema": ...}} or
    its inner {"name", "schema"} object around one."""
    if isinstance(loaded, dict) and isinstance(loaded.get("json_schema"), dict):
        loaded = loaded["json_schema"]
    if isinstance(loaded, dict) and "name" in loaded and isinstance(loaded.get("schema"), dict):
        loaded = loaded["schema"]
    if not isinstance(loaded, dict):
        raise UsageError("--json-schema needs a JSON object (a JSON schema)")
    return loaded


def _tools(path: Path) -> list[common_pb2.Tool]:
    loaded = _load(path)
    items = loaded if isinstance(loaded, list) else [loaded]
    return [_tool(item, path) for item in items]


def _tool(item: Any, path: Path) -> common_pb2.Tool:
    function = item.get("function", item) if isinstance(item, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise UsageError(f"{path}: a tool needs a name ({{name, description, parameters}})")
    parameters = function.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise UsageError(f"{path}: parameters must be a JSON schema object")
    definition = common_pb2.FunctionDefinition(
        name=function["name"],
        description=str(function.get("description") or ""),
        parameters_json=_dumps(parameters) if parameters is not None else "",
        strict=function.get("strict") is True,
    )
    return common_pb2.Tool(type="function", function=definition)


def _tool_choice(value: str, names: list[str]) -> common_pb2.ToolChoice:
    if value == "none":
        return common_pb2.ToolChoice(mode=common_pb2.TOOL_CHOICE_MODE_NONE)
    if not names:
        raise UsageError("--tool-choice needs at least one --tool")
    if value in _MODES:
        return common_pb2.ToolChoice(mode=_MODES[value])
    if value not in names:
        raise UsageError(f"--tool-choice {value!r} is none of the tools ({', '.join(names)})")
    return common_pb2.ToolChoice(function_name=value)
