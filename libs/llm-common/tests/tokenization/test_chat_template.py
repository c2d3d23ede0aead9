"""ChatTemplate: HF-compatible sandboxed rendering, the default template, template errors."""

from __future__ import annotations

import pytest

from llm_common.tokenization.chat_template import (
    DEFAULT_CHAT_TEMPLATE,
    ChatMessage,
    ChatTemplate,
    ChatTemplateError,
)

SPECIAL = {"bos_token": "<s>", "eos_token": "</s>"}
CONVERSATION = [ChatMessage("system", "Be brief."), ChatMessage("user", "Hi <b>&</b>")]


def render(source: str | None, messages: list[ChatMessage], gen: bool = False) -> str:
    return ChatTemplate(source, SPECIAL).render(messages, add_generation_prompt=gen)


def test_default_template_is_chatml() -> None:
    template = ChatTemplate(None, SPECIAL)
    assert template.is_default
    assert template.source == DEFAULT_CHAT_TEMPLATE
    prompt = template.render(CONVERSATION, add_generation_prompt=True)
    assert prompt == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi <b>&</b><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_default_template_without_generation_prompt() -> None:
    assert render(None, CONVERSATION[:1]) == "<|im_start|>system\nBe brief.<|im_end|>\n"


def test_model_template_sees_special_tokens_and_flags() -> None:
    source = "{{ bos_token }}{% for m in messages %}{{ m.role }}:{{ m.content }}{{ eos_token }}"
    source += "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
    template = ChatTemplate(source, SPECIAL)
    assert not template.is_default
    prompt = template.render(CONVERSATION, add_generation_prompt=True)
    assert prompt == "<s>system:Be brief.</s>user:Hi <b>&</b></s>assistant:"


def test_trim_and_lstrip_blocks_like_hf() -> None:
    source = (
        "{% for m in messages %}\n    {% if true %}\n{{ m.content }}|\n"
        "    {% endif %}\n{% endfor %}"
    )
    assert render(source, CONVERSATION) == "Be brief.|\nHi <b>&</b>|\n"


def test_name_is_passed_only_when_set() -> None:
    source = "{% for m in messages %}{{ m.name if m.name is defined else '-' }};{% endfor %}"
    messages = [ChatMessage("user", "a", name="ann"), ChatMessage("user", "b")]
    assert render(source, messages) == "ann;-;"


def test_tojson_does_not_escape_html() -> None:
    assert render("{{ messages[0] | tojson }}", [ChatMessage("user", "<&>é")]) == (
        '{"role": "user", "content": "<&>é"}'
    )


def test_raise_exception_becomes_chat_template_error() -> None:
    source = (
        "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}"
    )
    with pytest.raises(ChatTemplateError, match="first must be user"):
        render(source, CONVERSATION)


@pytest.mark.parametrize(
    "source",
    [
        "{{ messages.append(1) }}",  # immutable sandbox: no mutation of inputs
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",  # no escape to Python internals
    ],
)
def test_sandbox_blocks_unsafe_operations(source: str) -> None:
    with pytest.raises(ChatTemplateError):
        render(source, CONVERSATION)


def test_loop_controls_are_enabled() -> None:
    source = (
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
        "{{ m.role }}{% endfor %}"
    )
    assert render(source, CONVERSATION) == "system"
