"""`chat` and `complete`: streamed to the terminal token by token, then usage and trace id."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, TextIO

import grpc

from llmapi.common.v1 import common_pb2
from llmapi.llm.v1 import llm_service_pb2 as pb
from llmapi.llm.v1 import llm_service_pb2_grpc as pb_grpc
from llmctl import structured
from llmctl.answers import Answers, unary_answers, write_answers, write_logprobs, write_tail
from llmctl.connection import Credentials, new_traceparent

_FINISH = {
    common_pb2.FINISH_REASON_STOP: "stop",
    common_pb2.FINISH_REASON_LENGTH: "length",
    common_pb2.FINISH_REASON_CANCELLED: "cancelled",
    common_pb2.FINISH_REASON_CONTENT_FILTER: "content_filter",
    common_pb2.FINISH_REASON_ERROR: "error",
    common_pb2.FINISH_REASON_TOOL_CALLS: "tool_calls",
}


@dataclass(frozen=True, slots=True)
class Streams:
    out: TextIO  # the answer
    info: TextIO  # usage, ids (stderr, so `llmctl chat ... > answer.txt` keeps only text)


def add_sampling_arguments(parser: argparse.ArgumentParser, chat: bool = False) -> None:
    parser.add_argument("--model", default="demo", help="model name or alias (default: demo)")
    parser.add_argument("--max-tokens", type=int, help="completion tokens at most")
    parser.add_argument("--temperature", type=float, help="0 = greedy")
    parser.add_argument("--top-p", type=float)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--stop", action="append", default=[], help="stop string, repeatable")
    parser.add_argument("--no-stream", action="store_true", help="wait for the whole answer")
    parser.add_argument("--no-cache", action="store_true", help="bypass the response cache")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds (default 300)")
    structured.add_arguments(parser, chat)


def sampling(args: argparse.Namespace) -> common_pb2.SamplingParams:
    params = common_pb2.SamplingParams(stop=args.stop)
    for name in ("max_tokens", "temperature", "top_p", "seed"):
        value = getattr(args, name)
        if value is not None:
            setattr(params, name, value)
    structured.apply_sampling(args, params)
    return params


def _footer(
    usage: common_pb2.Usage, finish: int, request_id: str, trace_id: str, cache: str
) -> str:
    parts = [
        f"usage: prompt={usage.prompt_tokens} completion={usage.completion_tokens}"
        f" cached={usage.cached_tokens} total={usage.total_tokens}",
        f"finish={_FINISH.get(finish, 'unknown')}",  # type: ignore[call-overload]
    ]
    if cache and cache != "CACHE_HIT_MISS":
        parts.append(f"cache={cache.removeprefix('CACHE_HIT_').lower()}")
    parts += [f"request={request_id}", f"trace={trace_id}"]
    return "[" + " | ".join(parts) + "]"


def _stream(call: Any, streams: Streams, trace_id: str, live: bool) -> int:
    """Prints text as it arrives when `live` (one answer), else whole answers at the end."""
    usage, finish, request_id, cache = common_pb2.Usage(), 0, "", ""
    answers = Answers()
    try:
        for message in call:
            answers.add(message)
            if live and message.delta:
                streams.out.write(message.delta)
                streams.out.flush()
            request_id = message.request_id or request_id
            if message.HasField("cache"):
                cache = pb.CacheHit.Name(message.cache.hit)
            if message.HasField("usage"):
                usage, finish = message.usage, message.finish_reason
    except KeyboardInterrupt:
        call.cancel()  # stops the generation upstream; billed for what was produced
        streams.out.write("\n")
        streams.info.write(f"[cancelled | request={request_id} | trace={trace_id}]\n")
        return 130
    _stream_end(answers, streams, live)
    streams.info.write(_footer(usage, finish, request_id, trace_id, cache) + "\n")
    return 0


def _stream_end(answers: Answers, streams: Streams, live: bool) -> None:
    if not live:
        write_answers(answers.ordered(), streams.out, streams.info)
        return
    ordered = answers.ordered()
    if not ordered:  # an empty answer
        streams.out.write("\n")
        return
    write_tail(ordered[0], streams.out, bool(ordered[0].text))
    write_logprobs(ordered[0], streams.info)


def _unary(reply: Any, streams: Streams, trace_id: str) -> int:
    write_answers(unary_answers(reply), streams.out, streams.info)
    cache = pb.CacheHit.Name(reply.cache.hit) if reply.HasField("cache") else ""
    streams.info.write(
        _footer(reply.usage, reply.finish_reason, reply.request_id, trace_id, cache) + "\n"
    )
    return 0


def _live(fields: dict[str, Any]) -> bool:
    """One answer streams to the terminal as it comes; several are printed whole."""
    n: int = fields["sampling"].n
    return n <= 1


def _common(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "model": args.model,
        "sampling": sampling(args),
        "cache": pb.CachePolicy(bypass=args.no_cache),
    }


def chat(
    args: argparse.Namespace, channel: grpc.Channel, creds: Credentials, streams: Streams
) -> int:
    stub = pb_grpc.LLMServiceStub(channel)
    messages = []
    if args.system:
        messages.append(common_pb2.ChatMessage(role=common_pb2.ROLE_SYSTEM, content=args.system))
    messages.append(common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content=args.prompt))
    traceparent, trace_id = new_traceparent()
    metadata = (*creds.metadata(), ("traceparent", traceparent))
    fields = _common(args) | {"messages": messages} | structured.tool_fields(args)
    if args.no_stream:
        reply = stub.Chat(pb.ChatRequest(**fields), metadata=metadata, timeout=args.timeout)
        return _unary(reply, streams, trace_id)
    call = stub.ChatStream(pb.ChatStreamRequest(**fields), metadata=metadata, timeout=args.timeout)
    return _stream(call, streams, trace_id, _live(fields))


def complete(
    args: argparse.Namespace, channel: grpc.Channel, creds: Credentials, streams: Streams
) -> int:
    stub = pb_grpc.LLMServiceStub(channel)
    traceparent, trace_id = new_traceparent()
    metadata = (*creds.metadata(), ("traceparent", traceparent))
    fields = _common(args) | {"prompt": args.prompt}
    if args.no_stream:
        reply = stub.Complete(pb.CompleteRequest(**fields), metadata=metadata, timeout=args.timeout)
        return _unary(reply, streams, trace_id)
    call = stub.CompleteStream(
        pb.CompleteStreamRequest(**fields), metadata=metadata, timeout=args.timeout
    )
    return _stream(call, streams, trace_id, _live(fields))
