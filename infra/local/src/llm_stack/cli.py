"""`python -m llm_stack up|down|status|scale`: behind `make up`, `make down`, `make status`
and `make scale REPLICAS=N`."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

import grpc

from llm_common.config import ConfigError
from llm_envoy.local_spec import LocalSpec
from llm_stack import demo, k8s_secrets, probes, scaling
from llm_stack.byo import DEFAULT_REPLICAS, OwnModel, model_name, sample_call, with_own_model
from llm_stack.catalogue import local_replicas
from llm_stack.checkpoint import UnservableCheckpointError
from llm_stack.config import StackConfig
from llm_stack.credentials import ensure_credentials
from llm_stack.mesh_pki import mesh_paths
from llm_stack.process import pid_alive, pid_command, terminate_recorded
from llm_stack.redis_users import ensure_redis_users
from llm_stack.stack import Stack, StackError, render_envoy
from llm_stack.state import StackState, clear_state, read_state

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
DOWN_TIMEOUT_S = 90.0
SCALE_TIMEOUT_S = 300.0  # a replica loads its model before it is listed
_log = logging.getLogger("llm_stack")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m llm_stack", description=__doc__)
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="repository root")
    sub = parser.add_subparsers(dest="command", required=True)
    up_parser = sub.add_parser("up", help="start everything, print the endpoints, run until Ctrl-C")
    up_parser.add_argument(
        "--model", type=Path, help="serve this Hugging Face checkpoint directory (make up MODEL=)"
    )
    up_parser.add_argument("--model-name", help="its name in the API (default: directory name)")
    up_parser.add_argument(
        "--model-replicas", type=int, default=DEFAULT_REPLICAS, help="replicas of --model"
    )
    sub.add_parser("down", help="stop a running stack")
    sub.add_parser("status", help="what runs and whether it is healthy")
    scale_parser = sub.add_parser("scale", help="resize the generation replicas of a running stack")
    scale_parser.add_argument("replicas", type=int, help="replicas wanted (at least 1)")
    sub.add_parser("prepare", help="secrets and Envoy config for infra/compose.yaml")
    secrets_parser = sub.add_parser(
        "redis-secrets", help="Kubernetes secrets of the Redis ACL users (new passwords) to stdout"
    )
    secrets_parser.add_argument("--namespace", default="llm")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="llm-stack: %(message)s", stream=sys.stderr)
    try:
        config = StackConfig.from_env(args.root.resolve(), os.environ)
    except ConfigError as exc:
        print(f"llm-stack: configuration error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    own: OwnModel | None = None
    if args.command == "up" and args.model is not None:
        try:
            own = OwnModel(args.model, model_name(args.model, args.model_name), args.model_replicas)
            config, facts = with_own_model(config, own)
        except UnservableCheckpointError as exc:
            print(f"llm-stack: cannot serve {args.model}: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except ConfigError as exc:
            print(f"llm-stack: configuration error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        _log.info(
            "serving %s as %s: %s, %.1fM parameters, %s, %d replica(s)",
            own.path, own.name, facts.model_type, facts.parameters / 1e6, facts.dtype,
            own.replicas,
        )  # fmt: skip
    if args.command == "scale":
        return scale(config, args.replicas)
    if args.command == "redis-secrets":
        # For `| kubectl apply -f -`: the passwords go to the pipe, never to a log.
        sys.stdout.write(k8s_secrets.render(k8s_secrets.redis_secrets(args.namespace)))
        return EXIT_OK
    command = {"down": down, "status": status, "prepare": prepare}.get(args.command)
    try:
        return up(config, own) if command is None else command(config)
    except BrokenPipeError:  # `make status | head`: the reader has what it wanted
        return EXIT_OK


def _running(config: StackConfig) -> StackState | None:
    state = read_state(config.run_dir)
    if state is None or not pid_alive(state.supervisor_pid):
        return None
    return state if "llm_stack" in pid_command(state.supervisor_pid) else None


def up(config: StackConfig, own: OwnModel | None = None) -> int:
    """Start, print the banner, supervise until SIGINT/SIGTERM, stop in order."""
    if _running(config) is not None:
        print(
            "llm-stack: already running (see `make status`; `make down` stops it)", file=sys.stderr
        )
        return EXIT_FAILED
    _reap_leftovers(config)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stack = Stack(config)
    _log.info("starting (logs in %s)", config.run_dir / "logs")
    started = time.monotonic()
    try:
        endpoints = stack.start()
        assert stack.credentials is not None
        key = demo.create_key(endpoints.edge_http, stack.credentials.admin_key)
    except StackError as exc:
        print(f"llm-stack: could not start: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except grpc.RpcError as err:
        stack.stop()
        print(
            f"llm-stack: creating the demo key failed: {err.code().name}: {err.details()}",
            file=sys.stderr,
        )
        return EXIT_FAILED
    admin_file = str(stack.credentials.admin_key_file)
    print(demo.banner(endpoints, key, admin_file, str(config.run_dir)), flush=True)
    if own is not None:
        print(sample_call(endpoints.edge_http, own.name), flush=True)
    _log.info("healthy after %.1f s", time.monotonic() - started)
    try:
        stack.supervise(stop)
    finally:
        _log.info("stopping")
        stack.stop()
        _log.info("stopped")
    return EXIT_OK


def _reap_leftovers(config: StackConfig) -> None:
    """Children of a supervisor that was killed outright would hold the ports."""
    state = read_state(config.run_dir)
    if state is None:
        return
    for record in reversed(state.processes):
        if terminate_recorded(record.pid, record.command, grace_s=10):
            _log.info("stopped leftover %s (pid %d)", record.name, record.pid)
    clear_state(config.run_dir)


def down(config: StackConfig) -> int:
    """Ask the supervisor to stop everything and wait for it."""
    state = _running(config)
    if state is None:
        _reap_leftovers(config)
        print("llm-stack: not running")
        return EXIT_OK
    os.kill(state.supervisor_pid, signal.SIGTERM)
    deadline = time.monotonic() + DOWN_TIMEOUT_S
    while pid_alive(state.supervisor_pid) and time.monotonic() < deadline:
        time.sleep(0.2)  # waiting on another session's process
    if pid_alive(state.supervisor_pid):
        print(
            "llm-stack: the supervisor did not stop in time; stopping its children", file=sys.stderr
        )
        _reap_leftovers(config)
        return EXIT_FAILED
    print("llm-stack: stopped")
    return EXIT_OK


def scale(config: StackConfig, replicas: int) -> int:
    """Ask the supervisor of a running stack to resize, wait for its answer."""
    if replicas < 1:
        print("llm-stack: scale: REPLICAS must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    if _running(config) is None:
        print("llm-stack: not running (`make up` first)", file=sys.stderr)
        return EXIT_FAILED
    wanted = scaling.request(config.run_dir, replicas)
    deadline = time.monotonic() + SCALE_TIMEOUT_S
    while (result := scaling.read_result(config.run_dir, wanted)) is None:
        if time.monotonic() > deadline:
            print("llm-stack: scale: no answer from the supervisor in time", file=sys.stderr)
            return EXIT_FAILED
        time.sleep(0.2)  # another process's progress: polled
    if result["error"]:
        print(f"llm-stack: scale failed: {result['error']}", file=sys.stderr)
        return EXIT_FAILED
    print(f"llm-stack: {result['replicas']} replica(s): {', '.join(result['addresses'])}")
    return EXIT_OK


def status(config: StackConfig) -> int:
    """One line per process: pid, health, log; exit 1 when something is down."""
    state = _running(config)
    if state is None:
        print("llm-stack: not running")
        return EXIT_FAILED
    print(f"supervisor pid {state.supervisor_pid}, started {state.started_at}")
    tls = mesh_paths(config.run_dir).probe_tls if _mesh_tls(config) else None
    healthy = True
    for record in state.processes:
        alive = pid_alive(record.pid)
        if record.grpc_port:
            ok = alive and probes.grpc_serving(
                f"127.0.0.1:{record.grpc_port}", record.health_service, tls=tls
            )
            port = f":{record.grpc_port}"
        elif record.name == "envoy":
            ok = alive and probes.envoy_ready(state.endpoints.get("admin", ""))
            port = f"@{state.endpoints.get('edge_http', '')}"
        else:
            ok, port = alive, ""
        healthy &= ok
        word = "healthy" if ok else ("UNHEALTHY" if alive else "DOWN")
        print(f"  {record.name + port:<24} pid {record.pid:<8} {word:<10} {record.log}")
    return EXIT_OK if healthy else EXIT_FAILED


def _mesh_tls(config: StackConfig) -> bool:
    """Whether the running stack was started with MESH_MTLS=1 (its Envoy layout says so)."""
    try:
        return LocalSpec.read(config.run_dir / "envoy").mesh_tls
    except (FileNotFoundError, ValueError, KeyError):
        return config.mesh_mtls


def prepare(config: StackConfig) -> int:
    """What infra/compose.yaml mounts: the secrets and the one-host Envoy directory."""
    credentials = ensure_credentials(config.run_dir / "secrets")
    # compose's Redis loads the ACL file; each service reads its redis-<name>.env.
    ensure_redis_users(config.run_dir / "secrets", config.redis_prefix)
    render_envoy(config, local_replicas(config.models_config))
    print(
        f"secrets in {credentials.pepper_file.parent}; Envoy config in {config.run_dir / 'envoy'}"
    )
    print(f"admin API key: {credentials.admin_key_file}")
    return EXIT_OK
