"""The gRPC core settings the launchers give every service process."""

from __future__ import annotations

import os
import subprocess
import sys

from llm_common.grpc_runtime import GRPC_RUNTIME_ENV, with_grpc_runtime


def test_defaults_are_added_and_the_environment_wins() -> None:
    assert with_grpc_runtime({"A": "1"}) == {"A": "1", **GRPC_RUNTIME_ENV}
    assert with_grpc_runtime({"GRPC_EXPERIMENTS": ""})["GRPC_EXPERIMENTS"] == ""


def test_this_grpcio_knows_every_experiment_named() -> None:
    # grpc-core only logs an unknown experiment and runs on: an upgrade that drops one of
    # these would silently undo the setting, so it fails here instead.
    env = {**os.environ, **GRPC_RUNTIME_ENV}
    code = (
        "import asyncio, grpc\n"
        "async def main():\n"
        "    server = grpc.aio.server()\n"
        "    server.add_insecure_port('127.0.0.1:0')\n"
        "    await server.start()\n"
        "    await server.stop(None)\n"
        "asyncio.run(main())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "Unknown experiment" not in done.stderr
    bogus = {**env, "GRPC_EXPERIMENTS": "no_such_experiment_here"}
    noisy = subprocess.run(
        [sys.executable, "-c", code], env=bogus, capture_output=True, text=True, timeout=60
    )
    assert "Unknown experiment" in noisy.stderr  # the check above can fail
