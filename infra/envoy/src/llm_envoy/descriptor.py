"""The descriptor set the gRPC-JSON transcoder reads (LLMService plus google.rpc details)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

LLM_PROTO = "llmapi/llm/v1/llm_service.proto"
# Error details travel in google.rpc.Status; the transcoder prints them only if it knows them.
RPC_PROTOS = ("google/rpc/status.proto", "google/rpc/error_details.proto")


class DescriptorError(RuntimeError):
    """protoc failed to build the descriptor set."""


def _site_root(module: str, depth: int) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise DescriptorError(f"{module} is not installed")
    return Path(spec.origin).parents[depth]


def build_descriptor(protos_root: Path, out: Path) -> Path:
    """Write the descriptor set for LLMService (with its imports) to `out`."""
    from grpc_tools import protoc  # type: ignore[import-untyped]

    tools_include = _site_root("grpc_tools.protoc", 0) / "_proto"
    googleapis = _site_root("google.rpc.status_pb2", 2)  # site-packages holding google/rpc
    out.parent.mkdir(parents=True, exist_ok=True)
    args = [
        "protoc",
        f"-I{protos_root}",
        f"-I{googleapis}",
        f"-I{tools_include}",
        "--include_imports",
        f"--descriptor_set_out={out}",
        LLM_PROTO,
        *RPC_PROTOS,
    ]
    if protoc.main(args) != 0:
        raise DescriptorError(f"protoc could not build {out} from {protos_root}")
    return out
