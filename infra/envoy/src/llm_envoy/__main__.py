"""`python -m llm_envoy k8s|local`: render the Envoy configs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from llm_envoy import layouts, render
from llm_envoy.policy import DEFAULT_POLICY_FILE, PolicyError, load_policy
from llm_envoy.topology import Endpoint


def _endpoint(text: str) -> Endpoint:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected host:port, got {text!r}")
    return Endpoint(host, int(port))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llm_envoy", description=__doc__)
    parser.add_argument("--protos", type=Path, default=Path("protos"), help="protos/ directory")
    parser.add_argument("--policy", type=Path, default=DEFAULT_POLICY_FILE, help="policy.yaml")
    sub = parser.add_subparsers(dest="command", required=True)
    k8s = sub.add_parser("k8s", help="the Kubernetes edge and sidecars")
    k8s.add_argument("--out", type=Path, default=Path("infra/k8s/base/envoy"))
    k8s.add_argument("--namespace", default=layouts.NAMESPACE)
    local = sub.add_parser("local", help="the one-host config (default ports)")
    local.add_argument("--out", type=Path, required=True, help="Envoy's working directory")
    local.add_argument("--otlp", type=_endpoint, help="OTLP/gRPC collector host:port")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    try:
        policy = load_policy(args.policy)
    except PolicyError as exc:
        sys.exit(str(exc))
    if args.command == "k8s":
        for path in render.render_k8s(args.out, args.protos, args.namespace, policy):
            print(path)
    else:
        layout = layouts.local_layout(layouts.LocalPorts(), otlp=args.otlp, policy=policy)
        print(render.render_local(layout, args.out, args.protos))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
