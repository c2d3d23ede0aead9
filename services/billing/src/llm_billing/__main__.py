"""Entry point: `python -m llm_billing [serve|export|restore]` / `llm-billing`."""

from __future__ import annotations

import os
import sys

from llm_billing.cli import run
from llm_billing.snapshot import SnapshotError
from llm_common.config import ConfigError

EXIT_FAILED = 1
EXIT_CONFIG_ERROR = 2


def main() -> None:
    """Read settings from the environment and run the command (serve by default)."""
    try:
        sys.exit(run(sys.argv[1:], os.environ))
    except ConfigError as exc:
        # Bad settings, prices or an unreachable Redis: one clear line, no traceback.
        print(f"llm-billing: configuration error: {exc}", file=sys.stderr)
        sys.exit(EXIT_CONFIG_ERROR)
    except SnapshotError as exc:
        print(f"llm-billing: snapshot error: {exc}", file=sys.stderr)
        sys.exit(EXIT_FAILED)
    except KeyboardInterrupt:
        pass  # SIGINT before the signal handlers were installed


if __name__ == "__main__":
    main()
