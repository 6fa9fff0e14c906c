"""corral's modules import each other without a cycle, the core only onnxruntime and numpy.

A cycle is what makes a module impossible to read, test or move on its own; the issue that
split the server edge removed the last one (``server/http.py`` and ``server/status.py``).
Every import counts but those under ``if TYPE_CHECKING:`` (never run): one inside a function
runs too, later.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "corral"
GENERATED = ("_pb2", "_pb2_grpc")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The corral modules ``path`` imports at run time (a name imported from a package that
    is a module of its own counts as that module)."""
    found: set[str] = set()
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path.parent)

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:
                    found.add(f"{base}.{alias.name}")
                elif base in modules:
                    found.add(base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    found.discard(_module_name(path))
    return found


def _graph() -> dict[str, set[str]]:
    paths = [p for p in PACKAGE.rglob("*.py") if not p.stem.endswith(GENERATED)]
    modules = {_module_name(p) for p in paths}
    return {_module_name(p): _imports(p, modules) for p in paths}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                connect(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found


def _without_package_faces(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    # A package's __init__ re-exports its modules' names: importing a name through it is an
    # import of the module that defines it, not of the package's other modules.
    faces = {name for name in graph if (PACKAGE.parent / name.replace(".", "/")).is_dir()}
    return {
        name: set(imports) - faces if name not in faces else set()
        for name, imports in graph.items()
    }


def test_no_module_of_corral_is_in_an_import_cycle():
    graph = _graph()
    assert "corral.server.http" in graph
    assert "corral.server.status" in graph["corral.server.http"]  # the status page's query
    assert _cycles(_without_package_faces(graph)) == []


def test_the_cycle_check_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_core_imports_no_edge_module():
    graph = _graph()
    core = [name for name in graph if name.startswith("corral._") and name.count(".") == 1]
    assert "corral._host" in core
    edge = ("corral.server", "corral.protocol", "corral.ray", "corral.cli", "corral.demo")
    leaks = {name: sorted(i for i in graph[name] if i.startswith(edge)) for name in core}
    assert {name: found for name, found in leaks.items() if found} == {}


#: Past this, a module holds more than one concept: split it by concept, not in halves.
MAX_MODULE_LINES = 800


def test_no_hand_written_module_is_over_800_lines():
    sizes = {
        str(path.relative_to(ROOT)): len(path.read_text().splitlines())
        for path in PACKAGE.rglob("*.py")
        if not path.stem.endswith(GENERATED)
    }
    assert sizes["corral/server/http.py"] > 100  # the walk found the modules
    assert {path: n for path, n in sizes.items() if n > MAX_MODULE_LINES} == {}
