"""Entry point: `python -m llm_router` / `llm-router`."""

from __future__ import annotations

from llm_common.cli import serve_service
from llm_router.config import Settings


async def _start(settings: Settings) -> None:
    # Imported after logging is configured, so errors while importing are logged as JSON.
    from llm_router.server import serve

    await serve(settings)


def main() -> None:
    """Read settings from the environment, configure logging, serve until signalled."""
    serve_service("llm-router", Settings.from_env, _start)


if __name__ == "__main__":
    main()
