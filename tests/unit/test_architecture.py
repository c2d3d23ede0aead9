"""The architecture rule, checked statically: libraries never run, services are never imported
by other services; services share only the `llmapi-proto` contracts and `llm-common`.

Every service's source (services/<svc>/src) and every library's (libs/<lib>/src) is parsed, not
imported; services and their packages are found on disk, so a new service is covered as well.
Tests may still start another service as a fixture: only src/ is checked.
"""

from __future__ import annotations

import ast
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def _projects(pattern: str) -> dict[str, Path]:
    """Directories holding a pyproject.toml under `pattern`, by directory name."""
    return {p.parent.name: p.parent for p in sorted(REPO.glob(f"{pattern}/pyproject.toml"))}


def _packages(project: Path) -> list[Path]:
    """The import packages of a src layout (build leftovers such as *.egg-info skipped)."""
    src = project / "src"
    return sorted(p for p in src.iterdir() if (p / "__init__.py").is_file()) if src.is_dir() else []


def _project_table(project: Path) -> dict[str, Any]:
    with (project / "pyproject.toml").open("rb") as file:
        table: dict[str, Any] = tomllib.load(file)["project"]
    return table


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _dependency_names(project: Path) -> set[str]:
    """Distribution names of every requirement, optional extras included."""
    table = _project_table(project)
    requirements = list(table.get("dependencies", []))
    for extra in table.get("optional-dependencies", {}).values():
        requirements += extra
    names = (re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", r) for r in requirements)
    return {_normalized(m.group()) for m in names if m}


def _python_files(project: Path) -> list[Path]:
    return [path for package in _packages(project) for path in sorted(package.rglob("*.py"))]


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, module) of every absolute import, and of import_module("...")/__import__("...")."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module
        elif isinstance(node, ast.Call) and _is_dynamic_import(node.func) and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                yield node.lineno, first.value


def _is_dynamic_import(func: ast.expr) -> bool:
    if isinstance(func, ast.Attribute):
        return func.attr == "import_module"
    return isinstance(func, ast.Name) and func.id in {"import_module", "__import__"}


SERVICES = _projects("services/*")
LIBRARIES = _projects("libs/*")
# Top-level import package -> the service that owns it; distribution name -> service.
SERVICE_PACKAGES = {pkg.name: name for name, svc in SERVICES.items() for pkg in _packages(svc)}
SERVICE_DISTRIBUTIONS = {_normalized(_project_table(svc)["name"]): n for n, svc in SERVICES.items()}


def _violations(project: Path, foreign: set[str]) -> list[str]:
    """`file:line: imports module` for each import of a package in `foreign`."""
    files = _python_files(project)
    assert files, f"no Python files found under {project.relative_to(REPO)}/src"
    return [
        f"{path.relative_to(REPO)}:{line}: imports {module} (service {SERVICE_PACKAGES[top]})"
        for path in files
        for line, module in _imports(path)
        if (top := module.split(".")[0]) in foreign
    ]


def test_every_service_and_library_is_found() -> None:
    assert len(SERVICES) >= 2, f"services not found under {REPO / 'services'}"
    assert LIBRARIES, f"libraries not found under {REPO / 'libs'}"
    for name, service in SERVICES.items():
        assert _packages(service), f"service {name} has no package under src/"
    assert len(SERVICE_DISTRIBUTIONS) == len(SERVICES)


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_a_service_imports_no_other_service(name: str) -> None:
    own = {pkg.name for pkg in _packages(SERVICES[name])}
    found = _violations(SERVICES[name], set(SERVICE_PACKAGES) - own)
    assert not found, "services share only llmapi-proto and llm-common:\n" + "\n".join(found)


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_a_service_depends_on_no_other_service(name: str) -> None:
    own = _normalized(_project_table(SERVICES[name])["name"])
    found = _dependency_names(SERVICES[name]) & (set(SERVICE_DISTRIBUTIONS) - {own})
    assert not found, f"services/{name}/pyproject.toml depends on services: {sorted(found)}"


@pytest.mark.parametrize("name", sorted(LIBRARIES))
def test_a_library_uses_no_service(name: str) -> None:
    found = _violations(LIBRARIES[name], set(SERVICE_PACKAGES))
    assert not found, "libraries never import a service:\n" + "\n".join(found)
    deps = _dependency_names(LIBRARIES[name]) & set(SERVICE_DISTRIBUTIONS)
    assert not deps, f"libs/{name}/pyproject.toml depends on services: {sorted(deps)}"
