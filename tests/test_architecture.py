"""The code's shape, as docs/architecture.md states it: who may import whom, where device arrays are
handled, how long a function may be, and that the map names every module (and only real ones)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "server", "cli")
KERNEL_DIRS = (REPO / "engine" / "cpu", REPO / "engine" / "cuda")  # Numba kernels: long by nature
MAX_FUNCTION_LINES = 60
# The engine's core classes stay readable in one sitting (nano-vllm's are shorter still).
CORE_CLASSES = {
    "Scheduler": "engine/scheduler.py",
    "Engine": "engine/engine.py",
    "Sequence": "engine/sequence.py",
}
MAX_CORE_CLASS_LINES = 200


def modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py"))


def imported(path: Path) -> set[str]:
    """Every module name `path` imports (absolute imports; the project uses no relative ones)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def test_routes_reach_the_engine_only_through_its_public_types() -> None:
    """Routes talk to ModelService; of the engine they may name only engine.api's types."""
    offenders = {
        rel(p): sorted(n for n in imported(p) if n.startswith("engine") and n != "engine.api")
        for p in (REPO / "server" / "routes").glob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_engine_never_imports_the_server_or_the_tools() -> None:
    offenders = {
        rel(p): sorted(n for n in imported(p) if n.split(".")[0] in ("server", "cli"))
        for p in (REPO / "engine").rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_only_the_backend_tells_host_arrays_from_device_arrays() -> None:
    pattern = re.compile(r"isinstance\([^)]*np\.ndarray")
    allowed = (REPO / "engine" / "backend.py", *KERNEL_DIRS)
    found = [
        rel(p)
        for p in (REPO / "engine").rglob("*.py")
        if pattern.search(p.read_text()) and not any(p == a or a in p.parents for a in allowed)
    ]
    assert found == []


def definitions(path: Path, kinds: tuple[type, ...]) -> list[tuple[str, int]]:
    """(name, line count) of each function or class in `path`."""
    return [
        (node.name, (node.end_lineno or node.lineno) - node.lineno + 1)
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, kinds)
    ]


def test_functions_stay_short_outside_the_kernels() -> None:
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    long = {
        f"{rel(path)}:{name}": n
        for path in modules()
        if not any(k in path.parents for k in KERNEL_DIRS)
        for name, n in definitions(path, functions)
        if n > MAX_FUNCTION_LINES
    }
    assert long == {}


def test_the_engine_core_classes_stay_small() -> None:
    sizes = {
        name: dict(definitions(REPO / path, (ast.ClassDef,)))[name] for name, path in CORE_CLASSES.items()
    }
    assert {name: n for name, n in sizes.items() if n > MAX_CORE_CLASS_LINES} == {}


@pytest.fixture(scope="module")
def architecture() -> str:
    return (REPO / "docs" / "architecture.md").read_text()


def test_the_map_names_every_module(architecture: str) -> None:
    """docs/architecture.md lists each module by its path, in backticks (packages' __init__ aside)."""
    missing = [rel(p) for p in modules() if p.name != "__init__.py" and f"`{rel(p)}`" not in architecture]
    assert missing == []


def test_every_module_the_map_names_exists(architecture: str) -> None:
    named = set(re.findall(r"`((?:engine|server|cli)/[\w/]+\.py)`", architecture))
    assert named, "the map names modules as `package/module.py`"
    assert sorted(n for n in named if not (REPO / n).is_file()) == []
