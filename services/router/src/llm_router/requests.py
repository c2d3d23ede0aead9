"""Validated requests as the pipeline sees them (value objects, no transport concerns)."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from llmapi.common.v1 import common_pb2


class Kind(enum.Enum):
    """Chat (messages through the chat template) or raw-prompt completion."""

    CHAT = "chat"
    COMPLETION = "completion"


@dataclass(frozen=True, slots=True)
class CacheOptions:
    """The request's response-cache policy."""

    bypass: bool = False
    semantic: bool = False
    similarity_threshold: float | None = None
    store_nondeterministic: bool = False


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """A validated Chat/Complete request (streamed or not)."""

    kind: Kind
    model: str
    sampling: common_pb2.SamplingParams
    messages: tuple[common_pb2.ChatMessage, ...] = ()
    prompt: str = ""
    cache: CacheOptions = field(default_factory=CacheOptions)
    user: str = ""
    metadata: Mapping[str, str] = field(default_factory=dict)
    request_id: str = ""  # the client's idempotency id, empty when it sent none
    fingerprint: bytes = b""  # deterministic serialization, for idempotent billing ids
    tools: tuple[common_pb2.Tool, ...] = ()
    tool_choice: common_pb2.ToolChoice = field(default_factory=common_pb2.ToolChoice)
    parallel_tool_calls: bool = True

    @property
    def parses_tool_calls(self) -> bool:
        """The answer is read for tool calls: tools were given and tool_choice is not none."""
        return bool(self.tools) and (
            bool(self.tool_choice.function_name)
            or self.tool_choice.mode != common_pb2.TOOL_CHOICE_MODE_NONE
        )

    @property
    def forced_function(self) -> str | None:
        """The function a call is forced to ("" = any of the tools); None when not forced."""
        if self.tool_choice.function_name:
            return self.tool_choice.function_name
        if self.tools and self.tool_choice.mode == common_pb2.TOOL_CHOICE_MODE_REQUIRED:
            return ""
        return None

    @property
    def texts(self) -> tuple[str, ...]:
        """The user-supplied texts the input guard inspects, in field order."""
        if self.kind is Kind.CHAT:
            return tuple(m.content for m in self.messages)
        return (self.prompt,)

    @property
    def choices(self) -> int:
        """How many completions were asked for (sampling.n; 0 means 1)."""
        return max(self.sampling.n, 1)

    def text_field(self, index: int) -> str:
        """The request field name of `texts[index]`, for error details."""
        return f"messages[{index}].content" if self.kind is Kind.CHAT else "prompt"

    @property
    def deterministic(self) -> bool:
        """Greedy or seeded: the same request gives the same answer (cacheable)."""
        greedy = self.sampling.HasField("temperature") and self.sampling.temperature == 0.0
        return greedy or self.sampling.HasField("seed")


@dataclass(frozen=True, slots=True)
class EmbedRequest:
    """A validated Embed request."""

    model: str
    inputs: tuple[str, ...]
    normalize: bool = True
    user: str = ""
    request_id: str = ""
    fingerprint: bytes = b""
