"""Container health probe: `python -m llm_common.healthcheck` exits 0 only when the local service
answers SERVING on grpc.health.v1 (Docker HEALTHCHECK; Kubernetes has its own gRPC probe)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

TIMEOUT_S = 2.0


def is_serving(target: str, service: str = "", timeout_s: float = TIMEOUT_S) -> bool:
    """True when `target` reports SERVING for `service` ("" = the whole server)."""
    with grpc.insecure_channel(target) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout_s
            )
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def main(environ: Mapping[str, str] | None = None) -> int:
    env = os.environ if environ is None else environ
    port = env.get("GRPC_PORT", "")
    if not port.isdigit():
        print("healthcheck: GRPC_PORT must name the service's port", file=sys.stderr)
        return 2
    return 0 if is_serving(f"127.0.0.1:{port}") else 1


if __name__ == "__main__":
    sys.exit(main())
