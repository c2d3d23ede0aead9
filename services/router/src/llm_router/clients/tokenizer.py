"""llmapi.tokenizer.v1: the exact prompt tokens, as the tokenizer service gives them.

Which ids a request is admitted on (in-process, speculated, attested, memoized) is decided in
`llm_router.tokens.prompt`; this client only makes the calls."""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from llm_router.clients.calls import call
from llmapi.common.v1 import common_pb2
from llmapi.tokenizer.v1 import tokenizer_service_pb2 as tok_pb
from llmapi.tokenizer.v1 import tokenizer_service_pb2_grpc as tok_grpc


class TokenizerClient:
    """No breaker: without the tokenizer nothing is admitted."""

    service = "tokenizer"

    def __init__(self, channel: grpc.aio.Channel, timeout_s: float) -> None:
        self._stub = tok_grpc.TokenizerServiceStub(channel)
        self._timeout_s = timeout_s

    async def chat_prompt(
        self,
        model: str,
        messages: Sequence[common_pb2.ChatMessage],
        *,
        tools: Sequence[common_pb2.Tool] = (),
    ) -> list[int]:
        """Token ids of the templated conversation, ending with the assistant's turn marker."""
        request = tok_pb.ApplyChatTemplateRequest(
            model=model, messages=messages, add_generation_prompt=True, tools=tools
        )
        response = await call(
            self.service, lambda: self._stub.ApplyChatTemplate(request, timeout=self._timeout_s)
        )
        return list(response.token_ids)

    async def encode(self, model: str, text: str) -> list[int]:
        """Token ids of a raw prompt, with the tokenizer's special tokens (BOS)."""
        request = tok_pb.EncodeRequest(model=model, texts=[text], add_special_tokens=True)
        response = await call(
            self.service, lambda: self._stub.Encode(request, timeout=self._timeout_s)
        )
        return list(response.encodings[0].ids)

    async def fingerprint(self, model: str) -> str:
        """The service's tokenizer fingerprint of `model` (Info)."""
        request = tok_pb.InfoRequest(model=model)
        response = await call(
            self.service, lambda: self._stub.Info(request, timeout=self._timeout_s)
        )
        return response.fingerprint
