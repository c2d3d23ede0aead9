"""Every model's tokenizer, loaded once (blocking file reads) from its Hugging Face checkpoint."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
from tokenizers import Tokenizer

from llm_common.config import ConfigError
from llm_common.models_config import ModelCatalog, ModelSpec
from llm_common.tokenization.chat_template import (
    ChatMessage,
    ChatTemplate,
    TemplateData,
    ToolDefinition,
)
from llm_common.tokenization.fingerprint import fingerprint
from llm_common.tokenization.literal import LiteralText

log = logging.getLogger(__name__)

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
# Optional files: newer transformers save the template separately; older ones keep the named
# special tokens only in special_tokens_map.json.
CHAT_TEMPLATE_FILE = "chat_template.jinja"
SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"
# Every file load_model may read: together they decide the ids.
TOKENIZER_FILES = (
    TOKENIZER_FILE,
    TOKENIZER_CONFIG_FILE,
    CHAT_TEMPLATE_FILE,
    SPECIAL_TOKENS_MAP_FILE,
)
# The named special tokens HF passes to chat templates (as `bos_token`, ...).
NAMED_SPECIAL_TOKENS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


class ModelLoadError(ConfigError):
    """A model's tokenizer files are missing or invalid; the message names model and path."""


@dataclass(frozen=True, slots=True)
class SpecialToken:
    text: str
    id: int


@dataclass(frozen=True, slots=True)
class RenderedChat:
    prompt: str
    token_ids: list[int]
    default_template: bool


@dataclass(frozen=True, slots=True)
class TokenizerModel:
    """One model's tokenizer, chat template and limits; safe to share between threads."""

    name: str
    tokenizer: Tokenizer
    chat_template: ChatTemplate
    vocab_size: int
    max_context: int
    named_tokens: Mapping[str, SpecialToken]
    special_tokens: tuple[SpecialToken, ...]
    fingerprint: str  # see llm_common.tokenization.fingerprint
    # Encodes caller text with special-token text as characters (see tokenization.literal).
    literal: LiteralText

    @property
    def bos(self) -> SpecialToken | None:
        return self.named_tokens.get("bos_token")

    @property
    def eos(self) -> SpecialToken | None:
        return self.named_tokens.get("eos_token")

    @property
    def pad(self) -> SpecialToken | None:
        return self.named_tokens.get("pad_token")

    def encode_batch(self, texts: Sequence[str], *, add_special_tokens: bool) -> list[list[int]]:
        """Token ids per text; the Rust batch call releases the GIL and runs in parallel.

        Caller text: special-token text in it is encoded as characters, never as the token.
        """
        return self.literal.encode_batch(list(texts), add_special_tokens=add_special_tokens)

    def count_batch(self, texts: Sequence[str]) -> list[int]:
        """Token count per text, without special tokens (special-token text counts as text)."""
        return [len(ids) for ids in self.encode_batch(texts, add_special_tokens=False)]

    def decode_batch(
        self, sequences: Sequence[Sequence[int]], *, skip_special_tokens: bool
    ) -> list[str]:
        """Text per sequence; ids must already be checked against vocab_size."""
        return self.tokenizer.decode_batch(sequences, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self,
        messages: Sequence[ChatMessage],
        *,
        add_generation_prompt: bool,
        tools: Sequence[ToolDefinition] = (),
    ) -> RenderedChat:
        """Render and tokenize as HF apply_chat_template (no BOS on top of the template's),
        except that only the template's own special-token text maps to special ids: the
        request's strings are encoded as text (see tokenization.literal)."""
        shielded = self.literal.shield(TemplateData.of(messages, tools))
        rendered = self.chat_template.render_data(
            shielded.data, add_generation_prompt=add_generation_prompt
        )
        if not shielded.markers:  # nothing to keep from being parsed: HF's exact ids
            ids = self.tokenizer.encode(rendered, add_special_tokens=False).ids
            return RenderedChat(rendered, ids, self.chat_template.is_default)
        prompt, ids = self.literal.encode_rendered(rendered, shielded.markers)
        return RenderedChat(prompt, ids, self.chat_template.is_default)


class Registry:
    """Loaded models by canonical name; aliases from models.yaml resolve too."""

    def __init__(self, catalog: ModelCatalog, models: Mapping[str, TokenizerModel]) -> None:
        self._catalog = catalog
        self._models = dict(models)

    def get(self, name: str) -> TokenizerModel | None:
        spec = self._catalog.resolve(name)
        return None if spec is None else self._models.get(spec.name)

    def names(self) -> list[str]:
        return sorted(self._models)


def load_registry(catalog: ModelCatalog) -> Registry:
    """Load every catalogued model; ModelLoadError on the first one that cannot load."""
    models = {spec.name: load_model(spec) for spec in catalog.models.values()}
    return Registry(catalog, models)


def load_model(spec: ModelSpec) -> TokenizerModel:
    """Read tokenizer.json and tokenizer_config.json from the model's checkpoint directory."""
    directory = spec.checkpoint
    tokenizer = _load_tokenizer(spec.name, directory / TOKENIZER_FILE)
    config = _read_json(spec.name, directory / TOKENIZER_CONFIG_FILE, required=True)
    named = _named_tokens(spec.name, directory, config, tokenizer)
    model = TokenizerModel(
        name=spec.name,
        tokenizer=tokenizer,
        chat_template=_chat_template(spec.name, directory, config, named),
        vocab_size=tokenizer.get_vocab_size(with_added_tokens=True),
        max_context=spec.context_length,
        named_tokens=named,
        special_tokens=_added_special_tokens(tokenizer),
        fingerprint=fingerprint(directory, TOKENIZER_FILES),
        literal=LiteralText.of(tokenizer),
    )
    log.info(
        "model loaded",
        extra={"model": spec.name, "vocab_size": model.vocab_size, "path": str(directory)},
    )
    return model


def _load_tokenizer(model: str, path: Path) -> Tokenizer:
    if not path.is_file():
        raise ModelLoadError(f"model {model}: tokenizer file not found: {path}")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # the Rust side raises a bare Exception on bad JSON
        raise ModelLoadError(f"model {model}: cannot load {path}: {exc}") from exc


def _read_json(model: str, path: Path, *, required: bool) -> dict[str, Any]:
    if not path.is_file():
        if required:
            raise ModelLoadError(f"model {model}: tokenizer config not found: {path}")
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"model {model}: cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"model {model}: {path} must hold a JSON object")
    return data


def _token_text(value: Any) -> str | None:
    # HF writes a special token either as a string or as a serialized AddedToken dict.
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _named_tokens(
    model: str, directory: Path, config: Mapping[str, Any], tokenizer: Tokenizer
) -> dict[str, SpecialToken]:
    legacy = _read_json(model, directory / SPECIAL_TOKENS_MAP_FILE, required=False)
    named: dict[str, SpecialToken] = {}
    for key in NAMED_SPECIAL_TOKENS:
        text = _token_text(config.get(key, legacy.get(key)))
        if text is None:
            continue
        token_id = tokenizer.token_to_id(text)
        if token_id is None:
            raise ModelLoadError(f"model {model}: {key} {text!r} is not in the vocabulary")
        named[key] = SpecialToken(text, token_id)
    return named


def _added_special_tokens(tokenizer: Tokenizer) -> tuple[SpecialToken, ...]:
    decoder = tokenizer.get_added_tokens_decoder()
    return tuple(
        SpecialToken(token.content, token_id)
        for token_id, token in sorted(decoder.items())
        if token.special
    )


def _template_source(model: str, directory: Path, config: Mapping[str, Any]) -> str | None:
    path = directory / CHAT_TEMPLATE_FILE
    if path.is_file():
        return path.read_text(encoding="utf-8")
    source = config.get("chat_template")
    if isinstance(source, list):
        # Older HF format: a list of named templates; "default" is the one for plain chat.
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        source = named.get("default")
    if source is not None and not isinstance(source, str):
        raise ModelLoadError(f"model {model}: chat_template in {directory} is not a string")
    return source


def _chat_template(
    model: str, directory: Path, config: Mapping[str, Any], named: Mapping[str, SpecialToken]
) -> ChatTemplate:
    source = _template_source(model, directory, config)
    variables = {key: token.text for key, token in named.items()}
    try:
        return ChatTemplate(source, variables)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise ModelLoadError(
            f"model {model}: chat template in {directory} does not compile: {exc}"
        ) from exc
