"""Entry point: `python -m llm_billing [serve|export|restore]` / `llm-billing`."""

from __future__ import annotations

import os
import sys

from llm_billing.cli import run
from llm_billing.snapshot import SnapshotError
from llm_common.cli import config_errors_exit

EXIT_FAILED = 1


def main() -> None:
    """Read settings from the environment and run the command (serve by default)."""
    # Bad settings, prices or an unreachable Redis: one clear line, no traceback.
    with config_errors_exit("llm-billing"):
        try:
            sys.exit(run(sys.argv[1:], os.environ))
        except SnapshotError as exc:
            print(f"llm-billing: snapshot error: {exc}", file=sys.stderr)
            sys.exit(EXIT_FAILED)


if __name__ == "__main__":
    main()
