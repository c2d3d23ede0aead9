"""Canonical request identity: the exact key, the semantic namespace and the text to embed."""

from __future__ import annotations

import functools
import hashlib
import json
import re
import unicodedata
from dataclasses import dataclass, field

import numpy as np

from llmapi.cache.v1 import cache_service_pb2 as pb
from llmapi.common.v1 import common_pb2

_SPACE = re.compile(r"\s+")
DEFAULT_TEMPERATURE = 1.0
DEFAULT_TOP_P = 1.0


@dataclass(frozen=True, slots=True)
class RequestKey:
    """Everything the cache derives from one CacheKey.

    `entry_id` is the exact key: a digest over tenant, model, the canonical prompt and every
    output-changing sampling parameter. `namespace` scopes semantic matching to one tenant,
    model, parameter class and conversation context; `semantic_text` is what gets embedded.
    Both are derived from `source` on first use: exact lookups, the hot path, never need
    them (`source` must not change meanwhile; the service never changes a request).
    """

    tenant: str
    model: str
    entry_id: str
    deterministic: bool
    replayable: bool  # False when the response would carry data a cache entry lacks
    source: pb.CacheKey = field(repr=False, compare=False)
    params: bytes = field(repr=False, compare=False)  # canonical sampling parameters
    _semantic: tuple[str, str | None] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    @property
    def namespace(self) -> str:
        return self._semantic_identity()[0]

    @property
    def semantic_text(self) -> str | None:
        return self._semantic_identity()[1]

    def _semantic_identity(self) -> tuple[str, str | None]:
        found = self._semantic
        if found is None:
            context, text = _semantic_parts(self.source)
            found = (_digest(b"ns/v1", self.tenant, self.model, self.params, context), text)
            object.__setattr__(self, "_semantic", found)  # a cache, not a change of value
        return found


def request_key(key: pb.CacheKey) -> RequestKey:
    """The canonical identity of a validated CacheKey."""
    params, deterministic = _canonical_params(key.sampling)
    exact = _digest(b"exact/v1", key.tenant_id, key.model, _prompt_bytes(key), params)
    return RequestKey(
        tenant=key.tenant_id,
        model=key.model,
        entry_id=exact,
        deterministic=deterministic,
        # Logprobs (and their alternatives) are not kept with an entry.
        replayable=not (key.sampling.logprobs or key.sampling.top_logprobs),
        source=key,
        params=params,
    )


@functools.lru_cache(maxsize=4096)  # once per lookup (key names): a digest each time added up
def tenant_tag(tenant: str) -> str:
    """The tenant's Redis hash tag: a digest, so any tenant id is a safe key part."""
    return _digest(b"tenant/v1", tenant)[:16]


def model_tag(model: str) -> str:
    """A model's digest for Redis key names."""
    return _digest(b"model/v1", model)[:16]


def pair_digest(namespace: str, semantic_text: str) -> str:
    """Identity of a semantic query, for blocking (query, entry) pairs after Feedback."""
    return _digest(b"query/v1", namespace, normalise(semantic_text))


def normalise(text: str) -> str:
    """NFC, whitespace runs collapsed, ends stripped."""
    return _SPACE.sub(" ", unicodedata.normalize("NFC", text)).strip()


def _digest(*parts: str | bytes) -> str:
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        data = part.encode("utf-8") if isinstance(part, str) else part
        # Length-prefixed, so ("ab", "c") and ("a", "bc") never collide.
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def _canonical_params(s: common_pb2.SamplingParams) -> tuple[bytes, bool]:
    """The output-changing parameters as canonical bytes, and whether output is deterministic.

    Greedy decoding (temperature 0) ignores top_p, top_k and seed, so they are left out and
    greedy requests that differ only there share entries.
    """
    # Few distinct parameter sets recur on every request: remembered by their wire form.
    return _params_of(s.SerializeToString(deterministic=True))


@functools.lru_cache(maxsize=1024)
def _params_of(serialized: bytes) -> tuple[bytes, bool]:
    s = common_pb2.SamplingParams.FromString(serialized)
    temperature = s.temperature if s.HasField("temperature") else DEFAULT_TEMPERATURE
    params: dict[str, object] = {
        "temperature": float(np.float32(temperature)),
        "max_tokens": s.max_tokens if s.HasField("max_tokens") else None,
        "stop": sorted(set(s.stop)),
        "stop_token_ids": sorted(set(s.stop_token_ids)),
        "ignore_eos": s.ignore_eos,
    }
    params.update(_shaping_params(s))
    greedy = temperature == 0.0
    if not greedy:
        params["top_p"] = float(np.float32(s.top_p if s.HasField("top_p") else DEFAULT_TOP_P))
        params["top_k"] = s.top_k
        params["seed"] = s.seed if s.HasField("seed") else None
    encoded = json.dumps(params, sort_keys=True, separators=(",", ":")).encode("utf-8")
    return encoded, greedy or s.HasField("seed")


def _shaping_params(s: common_pb2.SamplingParams) -> dict[str, object]:
    """Penalties, bias, min_tokens/min_p, n and the output format: each changes the output,
    even under greedy decoding. Only those set are included, so a request that uses none keeps
    the key it had before they existed."""
    params: dict[str, object] = {}
    for name in ("presence_penalty", "frequency_penalty", "min_p"):
        value = getattr(s, name)
        if value:
            params[name] = float(np.float32(value))
    if s.HasField("repetition_penalty"):
        params["repetition_penalty"] = float(np.float32(s.repetition_penalty))
    if s.logit_bias:
        params["logit_bias"] = sorted((k, float(np.float32(v))) for k, v in s.logit_bias.items())
    if s.min_tokens:
        params["min_tokens"] = s.min_tokens
    if s.n > 1:
        params["n"] = s.n
    if s.HasField("format"):
        form = s.format.SerializeToString(deterministic=True)
        params["format"] = hashlib.blake2b(form, digest_size=16).hexdigest()
    return params


def _prompt_bytes(key: pb.CacheKey) -> bytes:
    """Token ids when given (the exact prompt); else the messages; else the raw prompt."""
    if key.prompt_token_ids:
        return b"ids:" + np.asarray(key.prompt_token_ids, dtype="<i4").tobytes()
    if key.messages:
        turns = [
            [
                m.role,
                unicodedata.normalize("NFC", m.name),
                unicodedata.normalize("NFC", m.content),
                *_tool_parts(m),
            ]
            for m in key.messages
        ]
        return b"chat:" + json.dumps(turns, ensure_ascii=False).encode("utf-8") + _tools_bytes(key)
    return b"text:" + unicodedata.normalize("NFC", key.prompt).encode("utf-8")


def _tool_parts(message: common_pb2.ChatMessage) -> list[str]:
    """A message's tool calls and the call it answers (empty for plain turns: old keys hold)."""
    if not (message.tool_calls or message.tool_call_id):
        return []
    calls = [[c.id, c.function.name, c.function.arguments] for c in message.tool_calls]
    return [json.dumps(calls, ensure_ascii=False), message.tool_call_id]


def _tools_bytes(key: pb.CacheKey) -> bytes:
    """A digest of the offered tools ("" without tools), so different tool sets never match."""
    if not key.tools:
        return b""
    h = hashlib.blake2b(digest_size=16)
    for tool in key.tools:
        data = tool.SerializeToString(deterministic=True)
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return b"|tools:" + h.hexdigest().encode("ascii")


def _semantic_parts(key: pb.CacheKey) -> tuple[str, str | None]:
    """(context, text to embed). A chat matches semantically only on its last user message,
    and only against entries with the same earlier conversation (system prompt and turns):
    "how old is he?" after two different conversations must not share an answer."""
    if key.messages:
        *earlier, last = key.messages
        context = json.dumps(
            [
                [m.role, normalise(m.name), normalise(m.content).casefold(), *_tool_parts(m)]
                for m in earlier
            ],
            ensure_ascii=False,
        )
        text = normalise(last.content) if last.role == common_pb2.ROLE_USER else ""
        tools = _tools_bytes(key).decode("ascii")
        return "chat:" + context + tools, text or None
    text = normalise(key.prompt)
    return "text:", text or None
