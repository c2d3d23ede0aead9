"""Arguments, dispatch, and the promise: every failure is one line on stderr, never a traceback."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TextIO

import grpc

from llmctl import admin, catalog, generation, tenants
from llmctl.connection import Credentials, Target, UsageError, target_from_env
from llmctl.errors import one_line

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
Command = Callable[[argparse.Namespace, grpc.Channel, Credentials, TextIO, TextIO], int]


def _generation(kind: str) -> Command:
    fn = generation.chat if kind == "chat" else generation.complete

    def run(
        args: argparse.Namespace, ch: grpc.Channel, creds: Credentials, out: TextIO, err: TextIO
    ) -> int:
        return fn(args, ch, creds, generation.Streams(out, err))

    return run


def _plain(fn: Callable[[argparse.Namespace, grpc.Channel, Credentials, TextIO], int]) -> Command:
    def run(
        args: argparse.Namespace, ch: grpc.Channel, creds: Credentials, out: TextIO, err: TextIO
    ) -> int:
        return fn(args, ch, creds, out)

    return run


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(
        prog="llmctl",
        description="The LLM platform through its edge. Reads LLM_API_ADDR (default "
        "127.0.0.1:8080; https://host:port for TLS), LLM_API_KEY, LLM_ADMIN_KEY (key and "
        "usage administration) and LLM_CA_CERT (a CA to trust for TLS).",
    )
    root.add_argument("--addr", help="edge address (overrides LLM_API_ADDR)")
    root.add_argument("--ca-cert", type=Path, help="CA certificate for TLS (implies TLS)")
    sub = root.add_subparsers(dest="command", required=True, metavar="COMMAND")

    for name, what in (("chat", "chat with a model"), ("complete", "complete a raw prompt")):
        p = sub.add_parser(name, help=f"{what} (streams tokens)")
        p.add_argument("prompt", nargs="?", default="-", help="text, or - for stdin (default)")
        if name == "chat":
            p.add_argument("--system", help="a system message first")
        generation.add_sampling_arguments(p, chat=name == "chat")
        p.set_defaults(run=_generation(name))

    models = sub.add_parser("models", help="models you may use")
    models.set_defaults(run=_plain(catalog.models))
    embed = sub.add_parser("embed", help="embedding vectors of texts")
    embed.add_argument("texts", nargs="+")
    embed.add_argument("--model", required=True, help="an embedding model")
    embed.add_argument("--json", action="store_true", help="full vectors as JSON lines")
    embed.set_defaults(run=_plain(catalog.embed))

    keys = sub.add_parser("keys", help="API keys (needs an admin key)").add_subparsers(
        dest="keys_command", required=True, metavar="ACTION"
    )
    create = keys.add_parser("create", help="create a key; its secret is shown once")
    create.add_argument("--tenant", required=True)
    create.add_argument("--name", default="")
    create.add_argument(
        "--scope",
        action="append",
        default=[],
        help="repeatable (default: completion:write, embedding:read)",
    )
    create.add_argument("--model", action="append", default=[], help="allowed model, repeatable")
    create.add_argument("--rpm", type=int, default=0, help="requests per minute (0 = unlimited)")
    create.add_argument("--tpm", type=int, default=0, help="tokens per minute (0 = unlimited)")
    create.add_argument(
        "--concurrency", type=int, default=0, help="concurrent requests (0 = unlimited)"
    )
    create.add_argument("--ttl-hours", type=float, default=0.0, help="lifetime (0 = never expires)")
    create.set_defaults(run=_plain(admin.keys_create))
    listing = keys.add_parser("list", help="a tenant's keys (never secrets)")
    listing.add_argument("--tenant", required=True)
    listing.add_argument("--include-revoked", action="store_true")
    listing.set_defaults(run=_plain(admin.keys_list))
    revoke = keys.add_parser("revoke", help="revoke a key at once")
    revoke.add_argument("key_id")
    revoke.set_defaults(run=_plain(admin.keys_revoke))

    usage = sub.add_parser("usage", help="a tenant's requests, tokens and cost (admin key)")
    usage.add_argument("--tenant", required=True)
    usage.add_argument("--days", type=float, default=7.0, help="how far back (default 7)")
    usage.add_argument("--granularity", choices=("hour", "day", "total"), default="day")
    usage.add_argument("--key", help="only this key id")
    usage.add_argument("--model", help="only this model")
    usage.set_defaults(run=_plain(admin.usage))

    forget = tenants.add_parser(sub)
    forget.set_defaults(run=_plain(tenants.forget))

    for p in (models, embed, create, listing, revoke, usage, forget):
        p.add_argument("--timeout", type=float, default=30.0, help="seconds (default 30)")
    return root


def _read_prompt(args: argparse.Namespace, stdin: TextIO) -> None:
    if getattr(args, "prompt", None) == "-":
        args.prompt = stdin.read().strip()
        if not args.prompt:
            raise UsageError("no prompt: pass one as an argument or on stdin")


def main(
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    stdin: TextIO | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Run one command; returns the exit status (0 ok, 1 call failed, 2 usage, 130 interrupted)."""
    environ = os.environ if environ is None else environ
    out, err = stdout or sys.stdout, stderr or sys.stderr
    args = parser().parse_args(argv)
    try:
        target = target_from_env(environ, args.addr)
        if args.ca_cert is not None:
            target = Target(target.address, True, args.ca_cert)
        _read_prompt(args, stdin or sys.stdin)
        creds = Credentials.from_env(environ)
        with target.channel() as channel:
            status: int = args.run(args, channel, creds, out, err)
            return status
    except UsageError as exc:
        err.write(f"llmctl: {exc}\n")
        return EXIT_USAGE
    except grpc.RpcError as exc:
        err.write(f"llmctl: {one_line(exc)}\n")
        return EXIT_FAILED
    except KeyboardInterrupt:
        err.write("llmctl: interrupted\n")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_OK  # `llmctl chat ... | head`: the reader has what it wanted
