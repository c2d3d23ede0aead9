"""Entry point: `llmctl` / `python -m llmctl`."""

from __future__ import annotations

import sys

from llmctl.cli import main as _main


def main() -> None:
    sys.exit(_main())


if __name__ == "__main__":
    main()
