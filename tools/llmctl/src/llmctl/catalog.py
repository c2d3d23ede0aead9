"""`models` and `embed`."""

from __future__ import annotations

import argparse
import json
from typing import TextIO

import grpc

from llmapi.common.v1 import common_pb2
from llmapi.llm.v1 import llm_service_pb2 as pb
from llmapi.llm.v1 import llm_service_pb2_grpc as pb_grpc
from llmctl.connection import Credentials

PREVIEW_VALUES = 4


def models(args: argparse.Namespace, channel: grpc.Channel, creds: Credentials, out: TextIO) -> int:
    stub = pb_grpc.LLMServiceStub(channel)
    reply = stub.ListModels(pb.ListModelsRequest(), metadata=creds.metadata(), timeout=args.timeout)
    rows = [("MODEL", "KIND", "CONTEXT", "TIER", "ALIASES")]
    for m in reply.models:
        kind = common_pb2.ModelKind.Name(m.kind).removeprefix("MODEL_KIND_").lower()
        rows.append((m.name, kind, str(m.context_length), m.tier, ",".join(m.aliases) or "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        out.write(
            "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() + "\n"
        )
    return 0


def embed(args: argparse.Namespace, channel: grpc.Channel, creds: Credentials, out: TextIO) -> int:
    stub = pb_grpc.LLMServiceStub(channel)
    request = pb.EmbedRequest(model=args.model, inputs=args.texts)
    reply = stub.Embed(request, metadata=creds.metadata(), timeout=args.timeout)
    for item in sorted(reply.embeddings, key=lambda e: e.index):
        values = list(item.values)
        if args.json:
            out.write(json.dumps({"index": item.index, "embedding": values}) + "\n")
        else:
            preview = ", ".join(f"{v:.4f}" for v in values[:PREVIEW_VALUES])
            out.write(f"{item.index}: dim={len(values)} [{preview}, ...]\n")
    if not args.json:
        summary = f"model={reply.model} | tokens={reply.usage.prompt_tokens}"
        out.write(f"[{summary} | request={reply.request_id}]\n")
    return 0
