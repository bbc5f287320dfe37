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
MAX_CLASS_LINES = 200
# The server's layers, lowest first: a module imports only from its own layer or a lower one (imports
# under `if TYPE_CHECKING:` aside, since they never run). `mcp/` and `builtin_tools/` are libraries that
# import nothing else of the server. docs/architecture.md says what each layer is for.
SERVER_LAYERS: tuple[tuple[str, ...], ...] = (
    ("server/mcp/", "server/builtin_tools/"),
    ("server/config/",),
    ("server/state.py",),  # the app's shared parts, named by type only: every layer above may read it
    ("server/http/",),
    ("server/model/",),
    ("server/chat/",),
    ("server/streams/", "server/agents/"),
    ("server/apis/",),
    ("server/app.py", "server/router/"),
    ("server/cluster/",),
    ("server/__main__.py",),
)
ROOT_MODULES = {"server/__init__.py", "server/__main__.py", "server/app.py", "server/state.py"}


def modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py"))


def import_nodes(path: Path) -> list[ast.Import | ast.ImportFrom]:
    """The import statements of `path` that run (anywhere in it, in functions too); those under
    `if TYPE_CHECKING:` never run and are left out."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return found


def imported(path: Path) -> set[str]:
    """Every module name `path` imports when it runs (absolute imports; the project uses no relative
    ones)."""
    names: set[str] = set()
    for node in import_nodes(path):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif node.module:
            names.add(node.module)
    return names


def rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


# Who in the server may import which engine modules beyond engine.api (None: any).
ENGINE_REACH: dict[str, frozenset[str] | None] = {
    "server/model/": None,  # the seam: the one place the engine is driven
    "server/config/": None,  # flags parsed into the engine's value types (sampling, speculative, KV types)
    "server/__main__.py": frozenset({"engine.cpu", "engine.model_files"}),  # the CPU level before Numba
    # model files, not the engine: the caches, and a GGUF's header (Ollama's /api/tags details)
    "server/router/": frozenset({"engine.model_files", "engine.hf_cache", "engine.gguf", "engine.ftype"}),
}


def test_only_the_model_seam_reaches_into_the_engine() -> None:
    """The server drives the engine through `server/model/`; everything else names only engine.api's
    types (the config and the entry point aside, for what ENGINE_REACH says)."""
    offenders = {}
    for p in (REPO / "server").rglob("*.py"):
        reach = next((v for k, v in ENGINE_REACH.items() if rel(p).startswith(k)), frozenset())
        if reach is not None:
            names = {n for n in imported(p) if n.split(".")[0] == "engine" and n != "engine.api"}
            offenders[rel(p)] = sorted(names - reach)
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


def test_classes_stay_small_outside_the_kernels() -> None:
    """Every class reads in one sitting (nano-vllm's are shorter still)."""
    large = {
        f"{rel(path)}:{name}": n
        for path in modules()
        if not any(k in path.parents for k in KERNEL_DIRS)
        for name, n in definitions(path, (ast.ClassDef,))
        if n > MAX_CLASS_LINES
    }
    assert large == {}


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


def module_file(name: str) -> Path | None:
    """The repository file of a dotted module name, or None for a name outside the repository."""
    path = REPO.joinpath(*name.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def runtime_imports(path: Path) -> set[Path]:
    """The repository modules `path` imports when it runs, `from package import module` resolved to
    the module."""
    found: set[Path] = set()
    for node in import_nodes(path):
        if isinstance(node, ast.Import):
            found.update(f for a in node.names if (f := module_file(a.name)))
        elif node.module:
            for alias in node.names:
                target = module_file(f"{node.module}.{alias.name}") or module_file(node.module)
                if target:
                    found.add(target)
    found.discard(path)
    return found


def server_layer(path: Path) -> int:
    name = rel(path)
    return next(i for i, layer in enumerate(SERVER_LAYERS) if name.startswith(layer))


def test_every_server_module_has_a_layer_and_the_root_holds_only_the_app() -> None:
    server = [
        p for p in (REPO / "server").rglob("*.py") if p.name != "__init__.py" or p.parent.name == "server"
    ]
    unplaced = [rel(p) for p in server if not any(rel(p).startswith(x) for l in SERVER_LAYERS for x in l)]
    assert sorted(n for n in unplaced if n not in ROOT_MODULES or n == "server/__init__.py") == [
        "server/__init__.py"
    ]
    at_root = {rel(p) for p in (REPO / "server").glob("*.py")}
    assert at_root <= ROOT_MODULES


def test_server_modules_import_only_their_own_layer_or_lower() -> None:
    upward = {
        rel(p): sorted(
            rel(t)
            for t in runtime_imports(p)
            if t.is_relative_to(REPO / "server")
            and t.name != "__init__.py"
            and server_layer(t) > server_layer(p)
        )
        for p in (REPO / "server").rglob("*.py")
        if p.name != "__init__.py"
    }
    assert {k: v for k, v in upward.items() if v} == {}


def test_the_libraries_import_nothing_else_of_the_server() -> None:
    for library in SERVER_LAYERS[0]:
        outside = {
            rel(p): sorted(
                rel(t)
                for t in runtime_imports(p)
                if t.is_relative_to(REPO / "server") and not rel(t).startswith(library)
            )
            for p in (REPO / library).rglob("*.py")
        }
        assert {k: v for k, v in outside.items() if v} == {}


def import_cycles() -> list[list[str]]:
    """Each strongly connected group of two or more modules in the import graph (Tarjan's algorithm)."""
    graph = {rel(p): sorted(rel(t) for t in runtime_imports(p)) for p in modules()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, []):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while (top := stack.pop()) != node:
                group.append(top)
            if group:
                groups.append(sorted([node, *group]))

    for node in graph:
        if node not in index:
            connect(node)
    return groups


def test_no_modules_import_each_other_directly_or_in_a_loop() -> None:
    assert import_cycles() == []
