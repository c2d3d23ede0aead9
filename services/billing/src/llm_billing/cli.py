"""Command line: `serve` (default), `export` and `restore` of ledger snapshots, and the usage
store's `migrate`, `drain`, `reconcile` and `invoice` (store_cli.py)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TextIO

from llm_billing.config import Settings
from llm_billing.snapshot import export_snapshot, restore_snapshot
from llm_billing.store import make_client
from llm_billing.store_cli import STORE_COMMANDS, add_store_commands, run_store_command
from llm_billing.workers import serve_workers
from llm_common.audit import configure_audit
from llm_common.logging import configure_logging


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="llm-billing",
        description="Billing service; settings come from the environment (REDIS_URL, ...).",
    )
    commands = p.add_subparsers(dest="command")
    commands.add_parser("serve", help="run the gRPC service (the default)")
    export = commands.add_parser("export", help="write a snapshot of the ledger")
    export.add_argument("--output", "-o", default="-", help="file to write, '-' for stdout")
    restore = commands.add_parser("restore", help="load a snapshot into an empty ledger")
    restore.add_argument("--input", "-i", required=True, type=Path, help="snapshot file")
    restore.add_argument(
        "--force", action="store_true", help="restore even if ledger keys exist (overwrites)"
    )
    add_store_commands(commands)
    return p


def run(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    """Run one command; raises ConfigError and SnapshotError for __main__ to report."""
    args = parser().parse_args(argv)
    settings = Settings.from_env(environ)
    configure_logging(settings.server.service_name, settings.server.log_level)
    configure_audit(environ)  # budget changes: their own stream, apart from the service's log
    if args.command == "export":
        count = _export(settings, args.output)
        print(f"exported {count} keys", file=sys.stderr)
    elif args.command == "restore":
        count = asyncio.run(_restore(settings, args.input, args.force))
        print(f"restored {count} keys", file=sys.stderr)
    elif args.command in STORE_COMMANDS:
        return run_store_command(settings, args)
    elif settings.workers > 1:
        return serve_workers(settings)
    else:
        # Imported here so that a broken import is logged as JSON by the configured logging.
        from llm_billing.server import serve

        asyncio.run(serve(settings))
    return 0


def _export(settings: Settings, output: str) -> int:
    if output == "-":
        return asyncio.run(_export_to(settings, sys.stdout))
    partial = Path(output + ".partial")
    with partial.open("w", encoding="utf-8") as out:
        count = asyncio.run(_export_to(settings, out))
    partial.replace(output)  # a finished snapshot appears under its name at once
    return count


async def _export_to(settings: Settings, out: TextIO) -> int:
    client = make_client(settings.redis)
    try:
        return await export_snapshot(client, settings.ledger.key_prefix, out)
    finally:
        await client.aclose()


async def _restore(settings: Settings, source: Path, force: bool) -> int:
    client = make_client(settings.redis)
    try:
        return await restore_snapshot(client, settings.ledger.key_prefix, source, force=force)
    finally:
        await client.aclose()
