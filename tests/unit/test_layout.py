"""Layout rules a newcomer relies on: the README's RPC table points at files that exist, and
no hand-written source file in services/ or libs/ grows past 450 lines."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MAX_LINES = 450
TABLE_HEADER = "| service | RPC | handler | domain logic | tests |"


def _table_rows() -> list[list[str]]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    start = text.index(TABLE_HEADER)
    rows = []
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def _resolve(service: str, column: str, path: str) -> Path | None:
    """The file or folder a table cell names; None when it is not a path."""
    if not re.search(r"(\.py|/)$", path) or "*" in path:
        return None
    if path.startswith("llm_common/"):
        return REPO / "libs" / "llm-common" / "src" / path
    if column == "tests":
        return REPO / "services" / service / "tests" / path
    package = REPO / "services" / service / "src" / f"llm_{service}"
    # A bare file name after a folder in the same cell (`engine/engine.py` (`core.py`)).
    candidates = [package / path, *(d / path for d in package.rglob("*") if d.is_dir())]
    candidates.append(REPO / "libs" / "llm-common" / "src" / "llm_common" / "tokenization" / path)
    return next((c for c in candidates if c.exists()), candidates[0])


def test_the_readme_maps_every_service() -> None:
    services = {row[0] for row in _table_rows()}
    on_disk = {p.parent.name for p in REPO.glob("services/*/pyproject.toml")}
    assert services == on_disk


@pytest.mark.parametrize("row", _table_rows(), ids=lambda row: f"{row[0]}:{row[1][:30]}")
def test_every_path_in_the_readme_table_exists(row: list[str]) -> None:
    service = row[0]
    named = 0
    for column, cell in zip(("handler", "domain", "tests"), row[2:5], strict=True):
        for path in re.findall(r"`([^`]+)`", cell):
            resolved = _resolve(service, column, path)
            if resolved is not None:
                named += 1
                assert resolved.exists(), f"{service}: {path} ({column}) not found"
    assert named >= 3  # a handler, some domain logic and a test at least


def test_no_source_file_over_450_lines() -> None:
    sources = [
        path
        for root in ("services", "libs")
        for path in (REPO / root).rglob("*.py")
        if "tests" not in path.parts and "build" not in path.parts and "_pb2" not in path.name
    ]
    assert len(sources) > 100
    long = {
        str(path.relative_to(REPO)): count
        for path in sources
        if (count := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long, f"over {MAX_LINES} lines: {long}"
