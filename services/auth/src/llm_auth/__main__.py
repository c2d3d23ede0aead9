"""Entry point: `python -m llm_auth` serves; `python -m llm_auth keys …` runs operator commands."""

from __future__ import annotations

import asyncio
import os
import sys

from llm_common.config import ConfigError
from llm_common.logging import configure_logging

EXIT_CONFIG_ERROR = 2


def main() -> None:
    """Serve (no arguments) or run the `keys` command line."""
    if sys.argv[1:]:
        from llm_auth.cli import main as cli_main

        sys.exit(cli_main(sys.argv[1:], os.environ))
    try:
        from llm_auth.config import Settings

        settings = Settings.from_env(os.environ)
        configure_logging(settings.server.service_name, settings.server.log_level)
        # Imported after logging is configured, so errors while importing are logged as JSON.
        from llm_auth.server import serve

        asyncio.run(serve(settings))
    except ConfigError as exc:
        print(f"llm-auth: configuration error: {exc}", file=sys.stderr)
        sys.exit(EXIT_CONFIG_ERROR)
    except KeyboardInterrupt:
        pass  # SIGINT before the signal handlers were installed


if __name__ == "__main__":
    main()
