"""Tokenization inside the router, for deployments that ship the tokenizer files with it.

The tokenizer service is a round trip on every request's critical path, before anything else
can start (admission, cache lookup and generation all need the exact prompt tokens). With
ROUTER_TOKENIZE=auto or local the router runs the tokenizer service's own code on the model's
files (llm_tokenizer: the same tokenizer.json, chat template and special-token handling), so
the ids are the ones the service would return; models whose files it cannot read keep using
the service. Front ends of engines such as TGI and vLLM tokenize in-process for this reason.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from llm_common.errors import FieldViolation, InvalidArgument
from llm_common.logging import get_logger
from llm_common.models_config import ModelCatalog
from llm_tokenizer.chat_template import ChatMessage, ChatTemplateError
from llm_tokenizer.registry import ModelLoadError, TokenizerModel, load_model
from llm_tokenizer.validation import ROLE_NAMES
from llmapi.common.v1 import common_pb2

_log = get_logger(__name__)
R = TypeVar("R")

# Up to this many characters the work (tens to hundreds of microseconds) runs on the event
# loop; longer prompts go to a thread so one huge prompt does not stall every other request.
INLINE_MAX_CHARS = 1024


class TokenizeMode(enum.StrEnum):
    """Where prompts are tokenized (ROUTER_TOKENIZE). The shared design has the router call
    the tokenizer service, and that stays the default; in-process is for deployments that
    ship the tokenizer files with the router."""

    SERVICE = "service"  # always the tokenizer service
    AUTO = "auto"  # in-process for every model whose files load, the service for the rest
    LOCAL = "local"  # in-process for every model; start-up fails otherwise


@dataclass(frozen=True, slots=True)
class LocalTokenizer:
    """The in-process tokenizers, by canonical model name."""

    models: Mapping[str, TokenizerModel]

    def serves(self, model: str) -> bool:
        return model in self.models

    async def chat_prompt(
        self, model: str, messages: Sequence[common_pb2.ChatMessage]
    ) -> list[int]:
        """As the service's ApplyChatTemplate with add_generation_prompt, same errors."""
        converted = [_message(i, m) for i, m in enumerate(messages)]
        tokenizer = self.models[model]
        try:
            rendered = await _run(
                sum(len(m.content) for m in converted),
                lambda: tokenizer.apply_chat_template(converted, add_generation_prompt=True),
            )
        except ChatTemplateError as exc:
            raise InvalidArgument([FieldViolation("messages", str(exc))]) from exc
        return rendered.token_ids

    async def encode(self, model: str, text: str) -> list[int]:
        """As the service's Encode with add_special_tokens (BOS where the model has one)."""
        tokenizer = self.models[model]
        encoded = await _run(
            len(text), lambda: tokenizer.encode_batch([text], add_special_tokens=True)
        )
        return encoded[0]


def load_local(catalog: ModelCatalog, mode: TokenizeMode) -> LocalTokenizer | None:
    """The catalogued models' tokenizers that `mode` asks for (blocking: reads files)."""
    if mode is TokenizeMode.SERVICE:
        return None
    models: dict[str, TokenizerModel] = {}
    for spec in catalog.models.values():
        try:
            models[spec.name] = load_model(spec)
        except ModelLoadError as exc:
            if mode is TokenizeMode.LOCAL:
                raise
            # Expected where the router has no model files (a container without them).
            _log.info("tokenizing through the service", model=spec.name, reason=str(exc))
    if models:
        _log.info("tokenizing in-process", models=sorted(models))
    return LocalTokenizer(models)


def _message(index: int, message: common_pb2.ChatMessage) -> ChatMessage:
    role = ROLE_NAMES.get(message.role)
    if role is None:  # the router's validation rejects these first; kept as the service does
        raise InvalidArgument(
            [FieldViolation(f"messages[{index}].role", "must be system, user, assistant or tool")]
        )
    return ChatMessage(role=role, content=message.content, name=message.name)


async def _run(chars: int, work: Callable[[], R]) -> R:
    if chars <= INLINE_MAX_CHARS:
        return work()
    return await asyncio.to_thread(work)
