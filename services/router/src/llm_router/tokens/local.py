"""Tokenization inside the router, where the tokenizer files ship with it.

The tokenizer service is a round trip on every request's critical path, before anything else
can start (admission, cache lookup and generation all need the exact prompt tokens). With
ROUTER_TOKENIZE=speculate (the default) the router's own ids start that work while the
service's, which decide, are on their way (see PromptTokenizer.chat_prompt_ids); with
ROUTER_TOKENIZE=auto or local the router's ids replace the service's. Either way it runs the
shared tokenization library the service itself runs on the model's files
(llm_common.tokenization: the same tokenizer.json, chat template and special-token handling),
so the ids are the ones the service would return; models whose files it cannot read keep
using the service. Front ends of engines such as TGI and vLLM tokenize in-process for this
reason.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from llm_common.logging import get_logger
from llm_common.models_config import ModelCatalog
from llm_common.tokenization.messages import (
    DEFAULT_MAX_MESSAGES,
    DEFAULT_MAX_TEXT_BYTES,
    check_messages,
)
from llm_common.tokenization.offload import render_chat, run_sized
from llm_common.tokenization.registry import ModelLoadError, TokenizerModel, load_model
from llm_common.validation import Violations
from llmapi.common.v1 import common_pb2

_log = get_logger(__name__)


class TokenizeMode(enum.StrEnum):
    """Where prompts are tokenized (ROUTER_TOKENIZE). The shared design has the router call
    the tokenizer service for the exact count; `speculate` still does, but starts work on its
    own ids meanwhile. auto and local are for deployments that ship the tokenizer files with
    the router and trust them instead."""

    SERVICE = "service"  # always the tokenizer service
    # In-process ids start routing, the cache lookup and the replica's prefill; the service's
    # ids are awaited before admission and must match (else the work restarts on them).
    # Models whose files do not load here just wait for the service.
    SPECULATE = "speculate"
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
        v = Violations()
        v.require(bool(model), "model", "is required")
        # The service's default limits: the router's validation is stricter, these keep parity.
        converted = check_messages(
            v,
            "messages",
            messages,
            max_messages=DEFAULT_MAX_MESSAGES,
            max_text_bytes=DEFAULT_MAX_TEXT_BYTES,
        )
        v.raise_if_any()
        rendered = await render_chat(self.models[model], converted, add_generation_prompt=True)
        return rendered.token_ids

    async def encode(self, model: str, text: str) -> list[int]:
        """As the service's Encode with add_special_tokens (BOS where the model has one)."""
        tokenizer = self.models[model]
        encoded = await run_sized(
            len(text), tokenizer.encode_batch, [text], add_special_tokens=True
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
        _log.info("tokenizing in-process", mode=mode.value, models=sorted(models))
    return LocalTokenizer(models)
