"""Tool calling: per-family parsers of model output and formats that force calls.

Parsers (models.yaml `tool_parser`, PARSERS, parser_for(name)):

- "hermes" (Hermes 2 Pro, Qwen 2.5, and the default chat template): each call is a block
  ``<tool_call>\\n{"name": NAME, "arguments": {...}}\\n</tool_call>``; several blocks may
  follow one another. Text outside valid blocks is content, less the whitespace touching a
  valid block. A block that is not a call object stays content verbatim.
- "llama3_json" (Llama 3.1/3.2 JSON tool calling): the whole output is
  ``{"name": NAME, "parameters": {...}}``, optionally after ``<|python_tag|>``, several joined
  by ``;``. Otherwise the whole output is content.

Both accept "arguments" or "parameters", and arguments double-encoded as a JSON string.
Parsed arguments are the compact JSON text of the object (separators "," and ":", non-ASCII
as is). Parsers only parse: whether a name is among the request's tools is the caller's
check. They never raise on model output.

Streaming (parser.stream()) is exact: the content of all updates concatenates to parse()'s
content, and each call arrives whole in one CallDelta (id, name and arguments) as soon as it
is complete. A possible partial tag, and whitespace that may turn out to be layout next to a
call, are held back until decided. Call i's id is call_id(seed, i) for the `seed` passed to
parse()/stream(): deterministic, so replays and cached responses get the same ids.

Forced calls (forced_format, for tool_choice "required" or a named function) build a
common.v1.OutputFormat.tagged_json the engine compiles to a grammar:

- hermes: begin "<tool_call>\\n", end "\\n</tool_call>", separator "\\n";
- llama3_json: begin "", end "", separator "; ";

json_schema per call: {"type": "object", "properties": {"name": {"const": NAME}, ARGS:
PARAMETERS}, "required": ["name", ARGS], "additionalProperties": false}, ARGS being
"arguments" (hermes) or "parameters" (llama3_json) and PARAMETERS the tool's
parameters_json, or {"type": "object", "properties": {}} when it is empty. A named function
uses its schema alone; "required" uses {"anyOf": [one schema per tool]}. max_items is 1, or
MAX_PARALLEL_CALLS (8) with parallel calls.
"""

from llm_common.tools.forced import MAX_PARALLEL_CALLS, forced_format
from llm_common.tools.parsers import DEFAULT_PARSER, PARSERS, UnknownParserError, parser_for
from llm_common.tools.types import (
    CallDelta,
    ParsedOutput,
    ParsedToolCall,
    StreamUpdate,
    ToolCallParser,
    ToolStream,
    call_id,
    collect,
)

__all__ = [
    "DEFAULT_PARSER",
    "MAX_PARALLEL_CALLS",
    "PARSERS",
    "CallDelta",
    "ParsedOutput",
    "ParsedToolCall",
    "StreamUpdate",
    "ToolCallParser",
    "ToolStream",
    "UnknownParserError",
    "call_id",
    "collect",
    "forced_format",
    "parser_for",
]
