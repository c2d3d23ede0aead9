"""Entry point: `python -m llm_auth` serves; `python -m llm_auth keys …` runs operator commands."""

from __future__ import annotations

import os
import sys

from llm_auth.config import Settings
from llm_common.cli import serve_service


async def _start(settings: Settings) -> None:
    # Imported after logging is configured, so errors while importing are logged as JSON.
    from llm_auth.server import serve
    from llm_common.audit import configure_audit

    # Key administration is audited on its own stream, apart from the service's log.
    configure_audit(os.environ)
    await serve(settings)


def main() -> None:
    """Serve (no arguments) or run the `keys` command line."""
    if sys.argv[1:]:
        from llm_auth.cli import main as cli_main

        sys.exit(cli_main(sys.argv[1:], os.environ))
    serve_service("llm-auth", Settings.from_env, _start)


if __name__ == "__main__":
    main()
