"""TokenizerServicer: validate, call the model, build the response (no logic of its own)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import grpc

from llm_common.errors import NotFound
from llm_common.tokenization.offload import render_chat, run_sized
from llm_common.tokenization.registry import Registry, SpecialToken, TokenizerModel
from llm_common.validation import Violations
from llm_tokenizer import validation
from llm_tokenizer.config import Limits
from llmapi.tokenizer.v1 import tokenizer_service_pb2 as pb
from llmapi.tokenizer.v1 import tokenizer_service_pb2_grpc as pb_grpc

Context = grpc.aio.ServicerContext[Any, Any]

# Rough, only to size Decode work against offload.INLINE_MAX_CHARS.
CHARS_PER_TOKEN = 4


class TokenizerServicer(pb_grpc.TokenizerServiceServicer):
    """llmapi.tokenizer.v1.TokenizerService over a Registry of loaded tokenizers.

    Tokenizer calls on more than a little input run in worker threads (asyncio.to_thread): the
    Rust batch calls release the GIL, so the event loop keeps serving other RPCs and health
    checks meanwhile.
    """

    def __init__(self, registry: Registry, limits: Limits) -> None:
        self._registry = registry
        self._limits = limits

    # Method names are the contract's RPC names, hence the noqa N802.
    async def Encode(  # noqa: N802
        self, request: pb.EncodeRequest, context: Context
    ) -> pb.EncodeResponse:
        v = validation.start(request.model)
        texts = list(request.texts)
        validation.check_texts(v, "texts", texts, self._limits)
        v.raise_if_any()
        model = self._model(request.model)
        encodings = await run_sized(
            _chars(texts), model.encode_batch, texts, add_special_tokens=request.add_special_tokens
        )
        return _encode_response(encodings)

    async def Decode(  # noqa: N802
        self, request: pb.DecodeRequest, context: Context
    ) -> pb.DecodeResponse:
        v = validation.start(request.model)
        sequences = [list(seq.ids) for seq in request.sequences]
        validation.check_sequence_sizes(v, "sequences", sequences, self._limits)
        v.raise_if_any()
        model = self._model(request.model)
        validation.check_ids(v, "sequences", sequences, model.vocab_size)
        v.raise_if_any()
        cost = CHARS_PER_TOKEN * sum(map(len, sequences))
        texts = await run_sized(
            cost, model.decode_batch, sequences, skip_special_tokens=request.skip_special_tokens
        )
        return pb.DecodeResponse(texts=texts)

    async def ApplyChatTemplate(  # noqa: N802
        self, request: pb.ApplyChatTemplateRequest, context: Context
    ) -> pb.ApplyChatTemplateResponse:
        v = validation.start(request.model)
        messages = validation.check_messages(v, "messages", request.messages, self._limits)
        tools = validation.check_tools(v, "tools", request.tools, self._limits)
        v.raise_if_any()
        model = self._model(request.model)
        rendered = await render_chat(model, messages, request.add_generation_prompt, tools)
        return pb.ApplyChatTemplateResponse(
            prompt=rendered.prompt,
            token_ids=rendered.token_ids,
            default_template=rendered.default_template,
        )

    async def CountTokens(  # noqa: N802
        self, request: pb.CountTokensRequest, context: Context
    ) -> pb.CountTokensResponse:
        v = validation.start(request.model)
        if not validation.check_one_of(v, len(request.texts), len(request.messages)):
            v.raise_if_any()
        validation.check_tools_with_messages(v, len(request.tools), len(request.messages))
        if request.messages:
            return await self._count_messages(v, request)
        texts = list(request.texts)
        validation.check_texts(v, "texts", texts, self._limits)
        v.raise_if_any()
        model = self._model(request.model)
        counts = await run_sized(_chars(texts), model.count_batch, texts)
        return pb.CountTokensResponse(counts=counts, total=sum(counts))

    async def Info(  # noqa: N802
        self, request: pb.InfoRequest, context: Context
    ) -> pb.InfoResponse:
        validation.start(request.model).raise_if_any()
        model = self._model(request.model)
        response = pb.InfoResponse(
            model=model.name,
            vocab_size=model.vocab_size,
            max_context=model.max_context,
            special_tokens=[_special_token(t) for t in model.special_tokens],
            has_chat_template=not model.chat_template.is_default,
            fingerprint=model.fingerprint,
        )
        # Left unset (not zero) when the model has no such token.
        if model.bos is not None:
            response.bos.CopyFrom(_special_token(model.bos))
        if model.eos is not None:
            response.eos.CopyFrom(_special_token(model.eos))
        if model.pad is not None:
            response.pad.CopyFrom(_special_token(model.pad))
        return response

    async def _count_messages(
        self, v: Violations, request: pb.CountTokensRequest
    ) -> pb.CountTokensResponse:
        messages = validation.check_messages(v, "messages", request.messages, self._limits)
        tools = validation.check_tools(v, "tools", request.tools, self._limits)
        v.raise_if_any()
        # Counted as the prompt a generation request would send.
        rendered = await render_chat(self._model(request.model), messages, True, tools)
        return pb.CountTokensResponse(total=len(rendered.token_ids))

    def _model(self, name: str) -> TokenizerModel:
        model = self._registry.get(name)
        if model is None:
            raise NotFound("model", name)
        return model


def _chars(texts: Iterable[str]) -> int:
    return sum(map(len, texts))


def _encode_response(encodings: list[list[int]]) -> pb.EncodeResponse:
    response = pb.EncodeResponse(total_tokens=sum(map(len, encodings)))
    for ids in encodings:
        response.encodings.add().ids.extend(ids)
    return response


def _special_token(token: SpecialToken) -> pb.SpecialToken:
    return pb.SpecialToken(text=token.text, id=token.id)
