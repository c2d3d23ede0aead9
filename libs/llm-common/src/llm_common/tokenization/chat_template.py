"""Chat templates: a model's jinja2 template rendered in a sandbox, as Hugging Face does."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NoReturn

import jinja2
from jinja2 import meta
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

# A tool without parameters_json gets the same schema here as in forced calls.
from llm_common.tools.forced import EMPTY_PARAMETERS

ROLES = ("system", "user", "assistant", "tool")

# Used when a model ships no template: ChatML, the format of Hugging Face's former class-level
# default. `<|im_start|>`/`<|im_end|>` are plain text unless the vocabulary has them as tokens.
# Tools and calls take the Hermes/Qwen 2.5 form (tool parser "hermes"):
# - with tools, a first system turn lists them, one JSON object a line, inside <tools></tools>
#   after the conversation's own system message (if it starts with one), and asks for calls
#   as <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>;
# - an assistant message's calls follow its content as such blocks, one a line;
# - a tool message answering a call (tool_call_id set) wraps its content in
#   <tool_response>\n...\n</tool_response> inside a `tool` turn.
# A conversation without tools, calls or tool_call_ids renders exactly as plain ChatML.
TOOLS_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_INSTRUCTION = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def _literal(text: str) -> str:
    """`text` as a jinja string literal (jinja decodes Python escapes, as json.dumps writes)."""
    return json.dumps(text)


DEFAULT_CHAT_TEMPLATE = (
    "{% if tools %}"
    "{{ '<|im_start|>system\\n' }}"
    "{% if messages and messages[0]['role'] == 'system' %}"
    "{{ messages[0]['content'] + '\\n\\n' }}{% endif %}"
    "{{ " + _literal(TOOLS_PREAMBLE) + " }}"
    "{% for tool in tools %}{{ '\\n' + (tool | tojson) }}{% endfor %}"
    "{{ " + _literal(TOOLS_INSTRUCTION) + " + '<|im_end|>\\n' }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if tools and loop.first and message['role'] == 'system' %}{# in the tools turn #}"
    "{% elif message['role'] == 'assistant' and message['tool_calls'] is defined %}"
    "{{ '<|im_start|>assistant\\n' + message['content'] }}"
    "{% for call in message['tool_calls'] %}"
    "{% if message['content'] or not loop.first %}{{ '\\n' }}{% endif %}"
    "{{ '<tool_call>\\n' }}"
    "{{ {'name': call['function']['name'], 'arguments': call['function']['arguments']} | tojson }}"
    "{{ '\\n</tool_call>' }}"
    "{% endfor %}"
    "{{ '<|im_end|>\\n' }}"
    "{% elif message['role'] == 'tool' and message['tool_call_id'] is defined %}"
    "{{ '<|im_start|>tool\\n<tool_response>\\n' + message['content'] }}"
    "{{ '\\n</tool_response><|im_end|>\\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


class ChatTemplateError(ValueError):
    """The template rejected the conversation (raise_exception) or failed while rendering it."""


@dataclass(frozen=True, slots=True)
class MessageToolCall:
    """A call an assistant message made; `arguments` is the parsed JSON object."""

    id: str
    name: str
    arguments: Mapping[str, Any]

    def as_template_data(self) -> dict[str, Any]:
        # HF convention: arguments as a mapping, so templates serialise them their own way.
        data: dict[str, Any] = {
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        if self.id:
            data["id"] = self.id
        return data


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One turn; `role` is one of ROLES; `name`, `tool_call_id` optional (empty = absent)."""

    role: str
    content: str
    name: str = ""
    tool_calls: tuple[MessageToolCall, ...] = ()  # assistant messages only
    tool_call_id: str = ""  # tool messages only: the call this one answers

    def as_template_data(self) -> dict[str, Any]:
        # HF drops keys whose value is None, so templates can test `message.name is defined`.
        data: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.name:
            data["name"] = self.name
        if self.tool_calls:
            data["tool_calls"] = [call.as_template_data() for call in self.tool_calls]
        if self.tool_call_id:
            data["tool_call_id"] = self.tool_call_id
        return data


@dataclass(frozen=True, slots=True)
class ToolDefinition:
    """A function offered to the model; `parameters` is its parsed JSON Schema (None: none)."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] | None = None

    def as_template_data(self) -> dict[str, Any]:
        """HF's tool form: {"type": "function", "function": {name, description, parameters}}."""
        function: dict[str, Any] = {"name": self.name}
        if self.description:
            function["description"] = self.description
        function["parameters"] = EMPTY_PARAMETERS if self.parameters is None else self.parameters
        return {"type": "function", "function": function}


def _raise_exception(message: str) -> NoReturn:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # jinja's own tojson escapes HTML characters, which chat prompts must not have.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    """The sandbox HF's apply_chat_template uses: immutable, trim/lstrip blocks, same helpers."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class ChatTemplate:
    """A compiled chat template plus the special-token strings it may reference."""

    def __init__(self, source: str | None, special_tokens: Mapping[str, str]) -> None:
        """`source` None selects DEFAULT_CHAT_TEMPLATE; bad syntax raises TemplateSyntaxError."""
        self.is_default = source is None
        self.source = DEFAULT_CHAT_TEMPLATE if source is None else source
        env = _environment()
        self._template = env.from_string(self.source)
        # Whether tools reach the prompt at all: many older templates never read `tools`.
        self.renders_tools = "tools" in meta.find_undeclared_variables(env.parse(self.source))
        # bos_token, eos_token, ...: what HF passes as template variables.
        self._variables = dict(special_tokens)

    def render(
        self,
        messages: Sequence[ChatMessage],
        *,
        add_generation_prompt: bool,
        tools: Sequence[ToolDefinition] = (),
    ) -> str:
        """The prompt text; ChatTemplateError when the template rejects the conversation."""
        data = TemplateData.of(messages, tools)
        return self.render_data(data, add_generation_prompt=add_generation_prompt)

    def render_data(self, data: TemplateData, *, add_generation_prompt: bool) -> str:
        """As render, from the template variables (see TemplateData).

        No tools are passed as None, as HF does, so `tools is none` tests work.
        """
        try:
            return self._template.render(
                **self._variables,
                messages=data.messages,
                tools=data.tools or None,
                documents=None,
                add_generation_prompt=add_generation_prompt,
            )
        except jinja2.exceptions.TemplateError as exc:
            raise ChatTemplateError(str(exc)) from exc


@dataclass(frozen=True, slots=True)
class TemplateData:
    """What a request hands the template: every string in it came from the caller."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]

    @classmethod
    def of(cls, messages: Sequence[ChatMessage], tools: Sequence[ToolDefinition]) -> TemplateData:
        return cls([m.as_template_data() for m in messages], [t.as_template_data() for t in tools])
