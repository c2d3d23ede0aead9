"""Repository-wide pytest fixtures: Redis (from llm_common) and the demo checkpoint."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

pytest_plugins = ["llm_common.pytest_plugin"]

ROOT = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def model_root() -> Path:
    """Directory holding the demo checkpoint (MODEL_ROOT, default .cache/models)."""
    return Path(os.environ.get("MODEL_ROOT", ROOT / ".cache" / "models")).resolve()


@pytest.fixture(scope="session")
def demo_model_dir(model_root: Path) -> Path:
    """The demo Llama checkpoint, built on first use exactly as `make model` builds it."""
    spec = importlib.util.spec_from_file_location(
        "build_demo_model", ROOT / "infra" / "model" / "build_demo_model.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = sys.modules.get(spec.name)
    if module is None:
        module = importlib.util.module_from_spec(spec)
        # dataclasses look their module up in sys.modules while the class is created
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    path: Path = module.build(model_root / "demo-llama")
    return path


@pytest.fixture(scope="session")
def models_config() -> Path:
    return ROOT / "infra" / "config" / "models.yaml"
