"""Chat templates: a model's jinja2 template rendered in a sandbox, as Hugging Face does."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NoReturn

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROLES = ("system", "user", "assistant", "tool")

# Used when a model ships no template: ChatML, the format of Hugging Face's former class-level
# default. `<|im_start|>`/`<|im_end|>` are plain text unless the vocabulary has them as tokens.
DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


class ChatTemplateError(ValueError):
    """The template rejected the conversation (raise_exception) or failed while rendering it."""


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One turn; `role` is one of ROLES, `name` is optional (empty = absent)."""

    role: str
    content: str
    name: str = ""

    def as_template_data(self) -> dict[str, str]:
        # HF drops keys whose value is None, so templates can test `message.name is defined`.
        data = {"role": self.role, "content": self.content}
        if self.name:
            data["name"] = self.name
        return data


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
        self._template = _environment().from_string(self.source)
        # bos_token, eos_token, ...: what HF passes as template variables.
        self._variables = dict(special_tokens)

    def render(self, messages: Sequence[ChatMessage], *, add_generation_prompt: bool) -> str:
        """The prompt text; ChatTemplateError when the template rejects the conversation."""
        try:
            return self._template.render(
                **self._variables,
                messages=[m.as_template_data() for m in messages],
                tools=None,
                documents=None,
                add_generation_prompt=add_generation_prompt,
            )
        except jinja2.exceptions.TemplateError as exc:
            raise ChatTemplateError(str(exc)) from exc
