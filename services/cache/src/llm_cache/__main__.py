"""Entry point: `python -m llm_cache` / `llm-cache`."""

from __future__ import annotations

from llm_cache.config import Settings
from llm_common.cli import serve_service


async def _start(settings: Settings) -> None:
    # Imported after logging is configured, so errors while importing (torch) are logged.
    from llm_cache.server import serve

    await serve(settings)


def main() -> None:
    """Read settings from the environment, configure logging, serve until signalled."""
    serve_service("llm-cache", Settings.from_env, _start)


if __name__ == "__main__":
    main()
