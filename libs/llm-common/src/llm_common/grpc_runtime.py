"""gRPC core settings every service process starts with, set by whatever launches it.

grpc-core reads them from the environment once, when the process first imports grpc, so a
service cannot set them for itself: the images (ENV in infra/docker/Dockerfile), the local stack
(llm_stack) and the benchmarks put them into the environment of the processes they start.
A value already in the environment wins, so an operator can override or clear each one.

GRPC_EXPERIMENTS: grpcio 1.85 runs its listeners and client channels on the EventEngine by
default. With both turned back to the poller grpc-python used before, a unary call through
a grpc.aio server cost 15-20% less server CPU and about 10% less latency on the 2-core
machines this platform is measured on (bench/machine.py's probe server, three alternations),
and a whole stack served 15-17% more cache hits per second (interleaved rounds, same code,
both start orders; two identical stacks differed by 7%).
"""

from __future__ import annotations

from collections.abc import Mapping

GRPC_RUNTIME_ENV: Mapping[str, str] = {
    "GRPC_EXPERIMENTS": "-event_engine_listener,-event_engine_client",
}


def with_grpc_runtime(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` plus the defaults it does not set (for a process about to be started)."""
    return {**GRPC_RUNTIME_ENV, **environ}
