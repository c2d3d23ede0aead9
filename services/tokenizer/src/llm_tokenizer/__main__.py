"""Entry point: `python -m llm_tokenizer` / `llm-tokenizer`."""

from __future__ import annotations

import asyncio
import os
import sys

from llm_common.config import ConfigError
from llm_common.logging import configure_logging
from llm_tokenizer.config import Settings

EXIT_CONFIG_ERROR = 2


def main() -> None:
    """Read settings from the environment, configure logging, serve until signalled."""
    try:
        settings = Settings.from_env(os.environ)
        configure_logging(settings.server.service_name, settings.server.log_level)
        # Imported after logging is configured, so errors while importing are logged as JSON.
        from llm_tokenizer.server import serve

        asyncio.run(serve(settings))
    except ConfigError as exc:
        # Bad settings or an unloadable model: one clear line, no traceback.
        print(f"llm-tokenizer: configuration error: {exc}", file=sys.stderr)
        sys.exit(EXIT_CONFIG_ERROR)
    except KeyboardInterrupt:
        pass  # SIGINT before the signal handlers were installed (e.g. while loading)


if __name__ == "__main__":
    main()
