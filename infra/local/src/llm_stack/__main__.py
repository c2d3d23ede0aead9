"""Entry point: `python -m llm_stack up|down|status` (`make up`, `make down`, `make status`)."""

from __future__ import annotations

import sys

from llm_stack.cli import main as _main


def main() -> None:
    sys.exit(_main())


if __name__ == "__main__":
    main()
