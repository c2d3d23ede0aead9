"""The one owner of prompt tokens: which ids a prompt is admitted on. The tokenizer
service's, the router's own while they are attested, a memoized answer, or the router's own
as a speculation the service's answer confirms.

Models that `local` serves are tokenized in-process (see tokens.local), the rest by the
service. Models that `speculative` serves are tokenized both ways at once (`*_ids`): the
in-process ids come back at once, the service's as their confirmation; while the service
attests the router's files (see tokens.attestation), in-process only, with a sampled audit.
With a memo, an identical prompt from the same tenant is answered from it (see TokenMemo).

Every way ends in a `PromptTokens` value; speculated ids are judged once, at admission
(`admitted_ids`), where the "confirmed"/"mismatch" verdict is counted.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter

from llm_common.deadlines import without_deadline
from llm_common.errors import ServiceError
from llm_common.logging import get_logger
from llm_router.clients.tokenizer import TokenizerClient
from llm_router.requests import GenerationRequest, Kind
from llm_router.tokens.attestation import Attestation
from llm_router.tokens.local import LocalTokenizer
from llm_router.tokens.memo import TokenMemo, memo_key
from llmapi.common.v1 import common_pb2

_log = get_logger(__name__)


class TokenSource(enum.Enum):
    """How a prompt's ids were obtained."""

    SERVICE = "service"  # the tokenizer service's answer
    LOCAL = "local"  # in-process, for a model `ROUTER_TOKENIZE=auto|local` serves
    MEMO = "memo"  # an earlier answer for the same tenant and prompt
    ATTESTED = "attested"  # in-process, while the service vouches for the router's files
    SPECULATED = "speculated"  # in-process, the service's answer still to come (`confirm`)


@dataclass(frozen=True, slots=True)
class PromptTokens:
    """A prompt's token ids and how they were obtained. While `confirm` is set they are the
    router's own, computed to start work early; it resolves to the tokenizer service's, which
    are the answer: nothing is admitted before `admitted_ids` has checked them."""

    ids: list[int]
    how: TokenSource = TokenSource.SERVICE
    confirm: asyncio.Future[list[int]] | None = None

    @property
    def confirmed(self) -> bool:
        """Whether these ids are final (the service's, or ones it vouches for)."""
        return self.confirm is None

    async def from_service(self) -> PromptTokens:
        """The service's ids, without judging the router's (for a prompt the router's ids
        refuse: the service's answer decides, error or ids)."""
        if self.confirm is None:
            return self
        return PromptTokens(await self.confirm)


class UnconfirmedTokensError(Exception):
    """The tokenizer service's ids differ from the router's own: start over on `ids`."""

    def __init__(self, ids: list[int]) -> None:
        super().__init__("prompt tokens unconfirmed")
        self.ids = ids


async def admitted_ids(tokens: PromptTokens, verdicts: Counter) -> list[int]:
    """The ids admission counts: the one check of speculated ids, and the one place their
    verdict (`confirmed` | `mismatch`) is counted. Raises UnconfirmedTokensError on a mismatch
    (the tokenizer logs it and stops speculating on that model)."""
    if tokens.confirm is None:
        return tokens.ids
    ids = await tokens.confirm
    if ids != tokens.ids:
        verdicts.labels("mismatch").inc()
        raise UnconfirmedTokensError(ids)
    verdicts.labels("confirmed").inc()
    return ids


class PromptTokenizer:
    """The prompt tokens of a request, by whichever way is configured for its model."""

    def __init__(
        self,
        service: TokenizerClient,
        memo: TokenMemo | None = None,
        memo_counter: Counter | None = None,
        local: LocalTokenizer | None = None,
        speculative: LocalTokenizer | None = None,
        attestation: Attestation | None = None,
    ) -> None:
        self._service = service
        self._attestation = attestation
        self._audits: set[asyncio.Task[list[int]]] = set()  # strong references while running
        self._memo = memo
        self._memo_counter = memo_counter
        self._local = local
        self._speculative = speculative
        # Models whose in-process ids the service once contradicted: their files differ from
        # the service's (a skewed rollout), so speculating would only waste replica work.
        self._distrusted: set[str] = set()

    async def prompt_tokens(
        self, model: str, request: GenerationRequest, *, tenant: str, speculate: bool
    ) -> PromptTokens:
        """`request`'s prompt tokens for `model`, speculative only with `speculate` (the `auto`
        cascade compares exact counts across models, so it does not speculate)."""
        if request.kind is Kind.CHAT:
            if speculate:
                return await self.chat_prompt_ids(
                    model, request.messages, tenant=tenant, tools=request.tools
                )
            return await self._chat_tokens(model, request.messages, tenant, request.tools)
        if speculate:
            return await self.encode_ids(model, request.prompt, tenant=tenant)
        return await self._text_tokens(model, request.prompt, tenant)

    async def chat_prompt(
        self,
        model: str,
        messages: Sequence[common_pb2.ChatMessage],
        *,
        tenant: str = "",
        tools: Sequence[common_pb2.Tool] = (),
    ) -> list[int]:
        """Token ids of the templated conversation, ending with the assistant's turn marker.

        With tools the tokenizer service renders it (the in-process path has no tools)."""
        return (await self._chat_tokens(model, messages, tenant, tools)).ids

    async def _chat_tokens(
        self,
        model: str,
        messages: Sequence[common_pb2.ChatMessage],
        tenant: str,
        tools: Sequence[common_pb2.Tool],
    ) -> PromptTokens:
        local = None if tools else self._local
        fetch = self._chat_fetch(model, messages, local, tools)
        key = memo_key(_chat_parts(tenant, model, messages, tools))
        return await self._memoized(key, fetch, _fetched_by(local, model))

    async def chat_prompt_ids(
        self,
        model: str,
        messages: Sequence[common_pb2.ChatMessage],
        *,
        tenant: str = "",
        tools: Sequence[common_pb2.Tool] = (),
    ) -> PromptTokens:
        """As chat_prompt; speculative for the models `speculative` serves (without tools)."""
        if tools or self._speculative is None or not self._speculates(model):
            return await self._chat_tokens(model, messages, tenant, tools)
        key = memo_key(_chat_parts(tenant, model, messages))
        guess = self._speculative.chat_prompt(model, messages)
        return await self._speculate(model, key, self._chat_fetch(model, messages, None), guess)

    async def encode(self, model: str, text: str, *, tenant: str = "") -> list[int]:
        """Token ids of a raw prompt, with the tokenizer's special tokens (BOS)."""
        return (await self._text_tokens(model, text, tenant)).ids

    async def _text_tokens(self, model: str, text: str, tenant: str) -> PromptTokens:
        fetch = self._encode_fetch(model, text, self._local)
        key = memo_key(_text_parts(tenant, model, text))
        return await self._memoized(key, fetch, _fetched_by(self._local, model))

    async def encode_ids(self, model: str, text: str, *, tenant: str = "") -> PromptTokens:
        """As encode; speculative for the models `speculative` serves."""
        if self._speculative is None or not self._speculates(model):
            return await self._text_tokens(model, text, tenant)
        key = memo_key(_text_parts(tenant, model, text))
        guess = self._speculative.encode(model, text)
        return await self._speculate(model, key, self._encode_fetch(model, text, None), guess)

    def _chat_fetch(
        self,
        model: str,
        messages: Sequence[common_pb2.ChatMessage],
        local: LocalTokenizer | None,
        tools: Sequence[common_pb2.Tool] = (),
    ) -> Callable[[], Awaitable[list[int]]]:
        async def fetch() -> list[int]:
            if local is not None and local.serves(model):
                return await local.chat_prompt(model, messages)
            return await self._service.chat_prompt(model, messages, tools=tools)

        return fetch

    def _encode_fetch(
        self, model: str, text: str, local: LocalTokenizer | None
    ) -> Callable[[], Awaitable[list[int]]]:
        async def fetch() -> list[int]:
            if local is not None and local.serves(model):
                return await local.encode(model, text)
            return await self._service.encode(model, text)

        return fetch

    def _speculates(self, model: str) -> bool:
        assert self._speculative is not None
        return self._speculative.serves(model) and model not in self._distrusted

    async def _speculate(
        self,
        model: str,
        key: bytes,
        fetch: Callable[[], Awaitable[list[int]]],
        guess: Coroutine[Any, Any, list[int]],
    ) -> PromptTokens:
        remembered = self._recall(key)
        if remembered is not None:  # the service's own ids (or attested ones), from the memo
            guess.close()
            return PromptTokens(remembered, TokenSource.MEMO)
        if self._attestation is not None and self._attestation.attested(model):
            prompt = await self._attested(model, fetch, guess)
            # Attested ids are the service's by its own fingerprint; a repeat (a cache hit, a
            # retry) then skips the template and the tokenizer. A differing audit clears them.
            self._remember(key, prompt.ids)
            return prompt
        confirm = asyncio.ensure_future(self._fetch_into_memo(key, fetch))
        confirm.add_done_callback(_retrieve)
        try:
            ids = await guess
        except ServiceError:
            return PromptTokens(await confirm)  # the service's answer decides, error or ids
        except Exception:
            _log.warning("in-process tokenization failed, waiting for the service", exc_info=True)
            return PromptTokens(await confirm)
        except BaseException:
            confirm.cancel()
            raise
        confirm.add_done_callback(lambda done: self._judge(model, ids, done))
        return PromptTokens(ids, TokenSource.SPECULATED, confirm)

    async def _attested(
        self,
        model: str,
        fetch: Callable[[], Awaitable[list[int]]],
        guess: Coroutine[Any, Any, list[int]],
    ) -> PromptTokens:
        assert self._attestation is not None
        try:
            ids = await guess
        except Exception:  # refused or failed in-process: the service decides, as speculating
            return PromptTokens(await fetch())
        if self._attestation.audit():

            async def check() -> list[int]:
                return await fetch()

            # Detached from the request (no deadline, no cancel): it only checks the claim.
            audit = asyncio.get_running_loop().create_task(check(), context=without_deadline())
            self._audits.add(audit)
            audit.add_done_callback(lambda done: self._audited(model, ids, done))
        return PromptTokens(ids, TokenSource.ATTESTED)

    def _audited(self, model: str, guess: list[int], audit: asyncio.Task[list[int]]) -> None:
        self._audits.discard(audit)
        if audit.cancelled() or audit.exception() is not None:
            return
        assert self._attestation is not None
        equal = audit.result() == guess
        if not equal and self._memo is not None:
            self._memo.clear()  # it may hold attested ids that were not the service's
        self._attestation.audited(model, equal=equal)

    async def aclose(self) -> None:
        """Cancel the audits still in flight (shutdown)."""
        for audit in list(self._audits):
            audit.cancel()
        await asyncio.gather(*self._audits, return_exceptions=True)

    def _judge(self, model: str, guess: list[int], confirm: asyncio.Future[list[int]]) -> None:
        if confirm.cancelled() or confirm.exception() is not None or confirm.result() == guess:
            return
        if model not in self._distrusted:
            self._distrusted.add(model)
            _log.warning(
                "the tokenizer service's prompt tokens differ from the router's own (their"
                " tokenizer files differ); this model is not speculated on until restart",
                model=model,
            )

    async def _memoized(
        self, key: bytes, fetch: Callable[[], Awaitable[list[int]]], how: TokenSource
    ) -> PromptTokens:
        ids = self._recall(key)
        if ids is not None:
            return PromptTokens(ids, TokenSource.MEMO)
        return PromptTokens(await self._fetch_into_memo(key, fetch), how)

    def _recall(self, key: bytes) -> list[int] | None:
        if self._memo is None:
            return None
        ids = self._memo.get(key)
        if self._memo_counter is not None:
            self._memo_counter.labels("miss" if ids is None else "hit").inc()
        return ids

    async def _fetch_into_memo(
        self, key: bytes, fetch: Callable[[], Awaitable[list[int]]]
    ) -> list[int]:
        ids = await fetch()
        self._remember(key, ids)
        return ids

    def _remember(self, key: bytes, ids: list[int]) -> None:
        if self._memo is not None:
            self._memo.put(key, ids)


def _chat_parts(
    tenant: str,
    model: str,
    messages: Sequence[common_pb2.ChatMessage],
    tools: Sequence[common_pb2.Tool] = (),
) -> Iterable[bytes]:
    yield from (b"chat", tenant.encode(), model.encode())
    yield from (m.SerializeToString(deterministic=True) for m in messages)
    if tools:  # after the messages: a conversation without tools keeps its old key
        yield b"tools"
        yield from (t.SerializeToString(deterministic=True) for t in tools)


def _text_parts(tenant: str, model: str, text: str) -> Iterable[bytes]:
    return (b"text", tenant.encode(), model.encode(), text.encode("utf-8", "surrogatepass"))


def _fetched_by(local: LocalTokenizer | None, model: str) -> TokenSource:
    return TokenSource.LOCAL if local is not None and local.serves(model) else TokenSource.SERVICE


def _retrieve(future: asyncio.Future[Any]) -> None:
    # A confirmation nobody awaits any more (its request failed first) must not be reported
    # as a lost exception.
    if not future.cancelled():
        future.exception()
