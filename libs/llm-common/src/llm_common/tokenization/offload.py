"""Tokenizer work sized for an event loop, for any async caller of a TokenizerModel.

Inputs up to INLINE_MAX_CHARS characters are tokenized on the event loop: the work (~0.15 ms)
costs about as much as the hop to a worker thread. Larger inputs go to a thread; the Rust
batch calls release the GIL, so the loop keeps serving meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import ParamSpec, TypeVar

from llm_common.errors import FieldViolation, InvalidArgument
from llm_common.tokenization.chat_template import ChatMessage, ChatTemplateError, ToolDefinition
from llm_common.tokenization.registry import RenderedChat, TokenizerModel

P = ParamSpec("P")
R = TypeVar("R")

INLINE_MAX_CHARS = 1024
# Rough characters a tool definition or call adds to a prompt, only to size render work.
TOOL_CHARS = 256


async def run_sized(cost: int, func: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """func(*args, **kwargs), on the event loop when `cost` (characters) is small."""
    if cost <= INLINE_MAX_CHARS:
        return func(*args, **kwargs)
    return await asyncio.to_thread(func, *args, **kwargs)


async def render_chat(
    model: TokenizerModel,
    messages: Sequence[ChatMessage],
    add_generation_prompt: bool,
    tools: Sequence[ToolDefinition] = (),
) -> RenderedChat:
    """The templated, tokenized conversation; the template's refusals as InvalidArgument."""
    calls = sum(len(m.tool_calls) for m in messages)
    cost = sum(len(m.content) for m in messages) + TOOL_CHARS * (len(tools) + calls)
    try:
        return await run_sized(
            cost,
            model.apply_chat_template,
            messages,
            add_generation_prompt=add_generation_prompt,
            tools=tools,
        )
    except ChatTemplateError as exc:
        # The template's own checks (unsupported role, roles must alternate) are client errors.
        raise InvalidArgument([FieldViolation("messages", str(exc))]) from exc
