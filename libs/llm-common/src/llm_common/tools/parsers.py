"""The tool-call parser families by name (models.yaml `tool_parser`)."""

from __future__ import annotations

from llm_common.tools.hermes import HermesParser
from llm_common.tools.llama3 import Llama3JsonParser
from llm_common.tools.types import ToolCallParser

DEFAULT_PARSER = "hermes"
_PARSERS: dict[str, ToolCallParser] = {
    "hermes": HermesParser(),
    "llama3_json": Llama3JsonParser(),
}
PARSERS: tuple[str, ...] = tuple(_PARSERS)


class UnknownParserError(KeyError, ValueError):
    """No parser family has this name."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


def parser_for(name: str) -> ToolCallParser:
    """The parser called `name`; UnknownParserError (a KeyError and ValueError) otherwise."""
    try:
        return _PARSERS[name]
    except KeyError:
        raise UnknownParserError(
            f"unknown tool parser {name!r}; known: {', '.join(PARSERS)}"
        ) from None
