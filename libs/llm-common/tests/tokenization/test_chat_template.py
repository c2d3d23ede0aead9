"""ChatTemplate: HF-compatible sandboxed rendering, the default template, template errors."""

from __future__ import annotations

import pytest

from llm_common.tokenization.chat_template import (
    DEFAULT_CHAT_TEMPLATE,
    ChatMessage,
    ChatTemplate,
    ChatTemplateError,
    MessageToolCall,
    ToolDefinition,
)
from llm_common.tools import parser_for

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


WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}
TOOLS = [ToolDefinition("get_weather", "Weather now", WEATHER_SCHEMA), ToolDefinition("now")]
CALLS = (
    MessageToolCall("call_1", "get_weather", {"city": "Zürich"}),
    MessageToolCall("call_2", "now", {}),
)
TOOL_CHAT = [
    ChatMessage("system", "Be brief."),
    ChatMessage("user", "Weather?"),
    ChatMessage("assistant", "Checking.", tool_calls=CALLS),
    ChatMessage("tool", '{"temp": 21}', tool_call_id="call_1"),
]


def test_default_template_renders_tools_calls_and_results() -> None:
    prompt = ChatTemplate(None, SPECIAL).render(TOOL_CHAT, add_generation_prompt=True, tools=TOOLS)
    weather = (
        '{"type": "function", "function": {"name": "get_weather", "description": "Weather now", '
        '"parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}'
    )
    now = '{"type": "function", "function": {"name": "now", "parameters": {"type": "object", '
    now += '"properties": {}}}}'
    assert prompt == (
        "<|im_start|>system\nBe brief.\n\n# Tools\n\n"
        "You may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{weather}\n{now}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nWeather?<|im_end|>\n"
        "<|im_start|>assistant\nChecking.\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call><|im_end|>\n'
        '<|im_start|>tool\n<tool_response>\n{"temp": 21}\n</tool_response><|im_end|>\n'
        "<|im_start|>assistant\n"
    )


def test_default_template_tools_without_a_system_message() -> None:
    prompt = render_tools([ChatMessage("user", "Hi")])
    assert prompt.startswith("<|im_start|>system\n# Tools\n")
    assert prompt.endswith("</tool_call><|im_end|>\n<|im_start|>user\nHi<|im_end|>\n")


def render_tools(messages: list[ChatMessage]) -> str:
    return ChatTemplate(None, SPECIAL).render(messages, add_generation_prompt=False, tools=TOOLS)


def test_default_template_calls_are_what_the_hermes_parser_reads() -> None:
    turn = render_tools([ChatMessage("assistant", "Checking.", tool_calls=CALLS)])
    output = turn.removeprefix("<|im_start|>system\n").split("<|im_start|>assistant\n")[1]
    parsed = parser_for("hermes").parse(output.removesuffix("<|im_end|>\n"))
    assert parsed.content == "Checking."
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [
        ("get_weather", '{"city":"Zürich"}'),
        ("now", "{}"),
    ]


def test_default_template_without_tool_data_is_plain_chatml() -> None:
    # A tool message that answers no call, and no tools: the ChatML turn as before.
    messages = [ChatMessage("tool", "42"), ChatMessage("assistant", "ok")]
    assert render(None, messages) == (
        "<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\nok<|im_end|>\n"
    )


def test_default_template_equals_transformers_rendering() -> None:
    utils = pytest.importorskip("transformers.utils.chat_template_utils")
    expected, _ = utils.render_jinja_template(
        conversations=[[m.as_template_data() for m in TOOL_CHAT]],
        tools=[t.as_template_data() for t in TOOLS],
        chat_template=DEFAULT_CHAT_TEMPLATE,
        add_generation_prompt=True,
        **SPECIAL,
    )
    assert (
        ChatTemplate(None, SPECIAL).render(TOOL_CHAT, add_generation_prompt=True, tools=TOOLS)
        == expected[0]
    )


def test_model_templates_get_hf_tool_data() -> None:
    source = (
        "{% for t in tools %}{{ t.type }}:{{ t.function.name }}:{{ t.function.parameters.type }}"
        "{{ '+d' if t.function.description is defined }};{% endfor %}"
        "{% for m in messages %}{% for c in m.tool_calls or [] %}"
        "{{ c.id }}={{ c.function.name }}({{ c.function.arguments.city }});{% endfor %}"
        "{{ m.tool_call_id if m.tool_call_id is defined }}{% endfor %}"
    )
    template = ChatTemplate(source, SPECIAL)
    prompt = template.render(TOOL_CHAT, add_generation_prompt=False, tools=TOOLS)
    assert prompt == "function:get_weather:object+d;function:now:object;" + (
        "call_1=get_weather(Zürich);call_2=now();call_1"
    )
    assert template.renders_tools


def test_no_tools_reach_templates_as_none() -> None:
    source = "{{ 'none' if tools is none else tools | length }}"
    assert render(source, CONVERSATION) == "none"
    assert not ChatTemplate("{{ messages | length }}", SPECIAL).renders_tools
    assert ChatTemplate(None, SPECIAL).renders_tools
