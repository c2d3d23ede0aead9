"""`python -m llm_envoy k8s|local|apply|show|status`: render the Envoy configs, apply a
changed policy to a running Envoy, and read back what it runs."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from llm_envoy import apply, layouts, mesh_view, render
from llm_envoy.local_spec import LocalSpec
from llm_envoy.policy import DEFAULT_POLICY_FILE, PolicyError, load_policy
from llm_envoy.topology import Endpoint

EXIT_REFUSED = 2
REBUILT = "their health-checked hosts serve again after a first passing check (make mesh-status)"


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
    for name, text in (
        ("apply", "validate the policy and swap it into the running Envoy"),
        ("show", "the effective policy and the values the running Envoy holds"),
        ("status", "breakers, retries, ejections, health and route latency"),
    ):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument("--workdir", type=Path, required=True, help="the running Envoy's dir")
        cmd.add_argument("--json", action="store_true", help="machine-readable output")
    return parser


def _apply(args: argparse.Namespace) -> int:
    try:
        done = apply.apply(args.workdir, args.policy)
    except (PolicyError, apply.ApplyError) as exc:
        print(f"mesh-apply: not applied, the running config is unchanged.\n{exc}", file=sys.stderr)
        return EXIT_REFUSED
    if args.json:
        print(json.dumps({"version": done.version, "previous": done.previous,
                          "validate_s": done.validate_s, "apply_s": done.apply_s,
                          "replaced_clusters": done.replaced_clusters}))  # fmt: skip
    else:
        print(f"applied version {done.version} (was {done.previous or '-'}): "
              f"validated in {done.validate_s:.2f} s, live in {done.apply_s:.3f} s "
              f"({', '.join(done.files)})")  # fmt: skip
        if done.replaced_clusters:
            print(f"clusters rebuilt: {', '.join(done.replaced_clusters)}; {REBUILT}")
    return 0


def _render(args: argparse.Namespace) -> int:
    try:
        policy = load_policy(args.policy)
    except PolicyError as exc:
        print(exc, file=sys.stderr)
        return EXIT_REFUSED
    if args.command == "k8s":
        for path in render.render_k8s(args.out, args.protos, args.namespace, policy):
            print(path)
    elif args.command == "local":
        spec = LocalSpec(otlp=args.otlp)
        print(render.render_local_spec(spec, args.out, args.protos, policy))
    elif args.command == "show":
        admin = LocalSpec.read(args.workdir).admin
        if args.json:
            data = {"effective_policy": mesh_view.policy_dict(policy),
                    "live": mesh_view.live_values(admin)}  # fmt: skip
            print(json.dumps(data, indent=2))
        else:
            print(mesh_view.show_text(policy, admin))
    else:
        admin = LocalSpec.read(args.workdir).admin
        if args.json:
            data = {"clusters": mesh_view.cluster_status(admin),
                    "route_latency_ms": mesh_view.route_latency(admin)}  # fmt: skip
            print(json.dumps(data, indent=2))
        else:
            print(mesh_view.status_text(admin))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    code = _apply(args) if args.command == "apply" else _render(args)
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
