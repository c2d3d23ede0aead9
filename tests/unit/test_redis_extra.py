"""Redis is an extra of llm-common: only the services that use it (auth, cache, billing)
install it, and the others (router, tokenizer, inference) start without it.

Checked twice: statically, on every pyproject a redis-free service depends on; and by
importing each redis-free service's modules in a fresh interpreter where `redis` and
`hiredis` cannot be imported at all, as in an image built without them."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
REDIS_DISTRIBUTIONS = {"redis", "hiredis"}
WITH_REDIS = ["auth", "cache", "billing"]
WITHOUT_REDIS = {
    "router": ["llm_router.server", "llm_router.__main__"],
    "tokenizer": ["llm_tokenizer.server", "llm_tokenizer.__main__"],
    "inference": ["llm_inference.server", "llm_inference.__main__"],
}
# Our own distributions, where a requirement's dependencies can be read from the tree.
LOCAL = {"llm-common": "libs/llm-common", "llm-embed": "libs/llm-embed", "llmapi-proto": None}
# Refuses `import redis` / `import hiredis` the way a missing distribution does.
BLOCKER = """
import importlib.abc, sys
class Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"redis", "hiredis"}:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Missing())
"""


def _project(path: str) -> dict[str, Any]:
    with (REPO / path / "pyproject.toml").open("rb") as file:
        table: dict[str, Any] = tomllib.load(file)["project"]
    return table


def _requirement(text: str) -> tuple[str, set[str]]:
    """(normalised distribution name, extras) of a PEP 508 requirement."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?", text)
    assert match, text
    extras = {e.strip() for e in (match.group(2) or "").split(",") if e.strip()}
    return re.sub(r"[-_.]+", "-", match.group(1)).lower(), extras


def _installed_with(path: str, extras: set[str]) -> set[str]:
    """Every distribution the project at `path` pulls in with `extras`, following our own
    libraries (third-party ones are taken as leaves)."""
    table = _project(path)
    requirements = list(table.get("dependencies", []))
    for extra in extras:
        requirements += table.get("optional-dependencies", {})[extra]
    names: set[str] = set()
    for text in requirements:
        name, wanted = _requirement(text)
        names.add(name)
        if LOCAL.get(name):
            names |= _installed_with(str(LOCAL[name]), wanted)
    return names


@pytest.mark.parametrize("service", sorted(WITHOUT_REDIS))
def test_a_service_without_redis_does_not_install_it(service: str) -> None:
    pulled = _installed_with(f"services/{service}", set())
    assert "llm-common" in pulled  # the walk reached the shared library
    assert not pulled & REDIS_DISTRIBUTIONS, f"{service} installs {pulled & REDIS_DISTRIBUTIONS}"


@pytest.mark.parametrize("service", WITH_REDIS)
def test_a_service_using_redis_asks_for_the_extra(service: str) -> None:
    assert _installed_with(f"services/{service}", set()) >= REDIS_DISTRIBUTIONS
    wanted = [
        extras
        for name, extras in map(_requirement, _project(f"services/{service}")["dependencies"])
        if name == "llm-common"
    ]
    assert wanted == [{"redis"}]


def test_llm_common_itself_needs_no_redis() -> None:
    assert not _installed_with("libs/llm-common", set()) & REDIS_DISTRIBUTIONS
    assert _installed_with("libs/llm-common", {"redis"}) >= REDIS_DISTRIBUTIONS


@pytest.mark.parametrize("service", sorted(WITHOUT_REDIS))
def test_a_service_without_redis_imports_and_starts_without_it(service: str) -> None:
    modules = WITHOUT_REDIS[service]
    script = BLOCKER + "\n".join(
        [
            *(f"import {module}" for module in modules),
            "loaded = sorted(m for m in sys.modules if m.split('.')[0] in {'redis', 'hiredis'})",
            "assert not loaded, loaded",
            "print('ok')",
        ]
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "ok"


def test_the_blocker_does_refuse_redis() -> None:
    # Guards the check above: with the blocker in place, a module that needs Redis fails.
    script = BLOCKER + "import llm_common.redis_conn"
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode != 0
    assert "No module named 'redis'" in result.stderr
