"""The floor plan, held: folders in layers, faces instead of hubs, no cycle at any level.

``corral/`` has one folder per layer (``docs/architecture.md`` draws them). These tests hold:

- **the order**: a module imports only the layers :data:`ALLOWED` lists for its own (every
  import counts, those under ``if TYPE_CHECKING:`` too: an arrow read by a person or a
  type-checker runs up all the same);
- **the faces**: outside a core folder (``_base``, ``_onnx``, ``_compute``, ``_models``,
  ``_host``), corral imports only names its ``__init__`` lists in ``__all__``, never a module
  inside it;
- **no hubs**: no module but a package's ``__init__`` lists in ``__all__`` a name it does not
  define, and no import anywhere (corral, tests, benchmarks) takes a name from a module that
  does not define it, so that an import says where a name lives;
- **no cycle**: among modules, and among the folders inside each folder (imports under
  ``if TYPE_CHECKING:`` aside: they never run).

Each rule is shown to catch a violation of its own kind (the ``*_finds_*`` tests).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "corral"
GENERATED = ("_pb2", "_pb2_grpc")

#: The core folders: reached from outside only through their face.
CORE = ("_base", "_onnx", "_compute", "_models", "_host")

#: Each layer and the layers below it that it may import (its own always). A module's layer is
#: its folder under corral/, but for the public modules beside the face (``corral``), the
#: server's body budget and its token policy, which every transport shares
#: (``server.bodies``, ``server.tokens``).
ALLOWED: dict[str, frozenset[str]] = {
    "_proto": frozenset(),
    "_base": frozenset(),
    "_onnx": frozenset({"_base"}),
    "_compute": frozenset({"_base", "_onnx"}),
    "_models": frozenset({"_base", "_onnx", "_proto"}),
    "_host": frozenset({"_base", "_onnx", "_compute", "_models"}),
    "corral": frozenset(CORE),
}
_CORE_AND_FACE = frozenset({*CORE, "_proto", "corral"})
ALLOWED |= {
    "protocol": _CORE_AND_FACE,
    "server.bodies": frozenset(),
    "server.tokens": frozenset(),
    "server.observe": _CORE_AND_FACE | {"protocol", "server.bodies"},
    "server.http": _CORE_AND_FACE
    | {"protocol", "server.bodies", "server.tokens", "server.observe"},
    "server.connections": frozenset({"server.bodies", "server.http"}),
    "server.grpc": _CORE_AND_FACE
    | {"protocol", "server.bodies", "server.tokens", "server.observe"},
}
ALLOWED["server.native"] = _CORE_AND_FACE | {
    "protocol",
    "server.bodies",
    "server.tokens",
    "server.observe",
    "server.http",
    "server.grpc",
    "server.connections",
}
ALLOWED["server"] = _CORE_AND_FACE | {"protocol"} | {k for k in ALLOWED if k.startswith("server.")}
ALLOWED["ray"] = ALLOWED["server"] | {"server"}
ALLOWED["cli"] = ALLOWED["ray"] | {"ray"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str:
    """The layer of a corral module (see :data:`ALLOWED`)."""
    parts = module.split(".")[1:]
    if not parts or parts[0] in ("testing", "demo"):
        return "corral"
    if parts[0] == "server":
        if len(parts) == 1 or parts[1] in (
            "app",
            "settings",
            "processes",
            "ports",
            "group_member",
            "tls",
        ):
            return "server"
        return f"server.{parts[1]}"
    return parts[0]


@dataclass(frozen=True)
class Import:
    """One import of a corral module by another."""

    importer: str
    #: The module imported: a name imported from a package that is a module of its own
    #: counts as that module.
    module: str
    #: The names taken from it (empty for ``import x``).
    names: tuple[str, ...]
    type_checking: bool
    line: int
    #: For a module taken by name from its package (``from corral._onnx import ort``), that
    #: package.
    via: str | None = None


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(path: Path, modules: set[str], name: str | None = None) -> list[Import]:
    """Every import of a corral module in ``path``, at any depth."""
    name = name or module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[Import] = []

    def visit(node: ast.AST, type_checking: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, type_checking)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules:
                    found.append(Import(name, alias.name, (), type_checking, node.lineno))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            taken: list[str] = []
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:
                    found.append(
                        Import(name, f"{base}.{alias.name}", (), type_checking, node.lineno, base)
                    )
                else:
                    taken.append(alias.name)
            if taken and base in modules:
                found.append(Import(name, base, tuple(taken), type_checking, node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child, type_checking)

    visit(ast.parse(path.read_text(), str(path)), False)
    return [i for i in found if i.module != name]


def corral_paths() -> list[Path]:
    return [p for p in PACKAGE.rglob("*.py") if not p.stem.endswith(GENERATED)]


def all_modules() -> set[str]:
    return {module_name(p) for p in PACKAGE.rglob("*.py")}


def corral_imports() -> list[Import]:
    modules = all_modules()
    return [i for path in corral_paths() for i in imports_of(path, modules)]


# -- the order -------------------------------------------------------------------------------


def upward(imports: Iterable[Import]) -> list[str]:
    """The imports that run up a layer, or across to a sibling, described."""
    wrong = []
    for i in imports:
        here, there = layer_of(i.importer), layer_of(i.module)
        if there != here and there not in ALLOWED[here]:
            wrong.append(f"{i.importer}:{i.line} ({here}) imports {i.module} ({there})")
    return wrong


def test_every_module_imports_only_the_layers_below_its_own():
    imports = corral_imports()
    assert {layer_of(i.importer) for i in imports} <= set(ALLOWED)
    assert upward(imports) == []


def test_the_order_check_finds_an_import_up_and_one_across():
    up = Import("corral._compute.session", "corral._host.table", (), True, 1)
    across = Import("corral._compute.session", "corral._models.config", ("ModelConfig",), False, 2)
    down = Import("corral._host.table", "corral._compute", ("Session",), False, 3)
    assert len(upward([up, across, down])) == 2


# -- the faces -------------------------------------------------------------------------------


def face_names(folder: str) -> set[str]:
    tree = ast.parse((PACKAGE / folder / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return set(ast.literal_eval(node.value))
    return set()


def past_faces(imports: Iterable[Import], faces: dict[str, set[str]]) -> list[str]:
    """The imports that reach into a core folder from outside it, or take what its face hides."""
    wrong = []
    for i in imports:
        folder = i.module.split(".")[1] if i.module.count(".") else ""
        if folder not in faces or i.importer.split(".")[1:2] == [folder]:
            continue
        by_name = i.via == f"corral.{folder}" and i.module.rpartition(".")[2] in faces[folder]
        if i.module != f"corral.{folder}" and not by_name:
            wrong.append(f"{i.importer}:{i.line} reaches into {i.module}")
        elif hidden := sorted(set(i.names) - faces[folder]):
            wrong.append(f"{i.importer}:{i.line} takes {hidden} from corral.{folder}")
    return wrong


def test_outside_a_core_folder_corral_imports_only_its_face():
    faces = {folder: face_names(folder) for folder in CORE}
    assert all(faces.values()), faces
    assert past_faces(corral_imports(), faces) == []


def test_the_face_check_finds_a_reach_in_and_a_hidden_name():
    faces = {"_compute": {"Session"}}
    reach = Import("corral._host.table", "corral._compute.session", ("Session",), False, 1)
    hidden = Import("corral._host.table", "corral._compute", ("Scheduler",), False, 2)
    inside = Import(
        "corral._compute.process_runtime", "corral._compute.session", ("Lease",), False, 3
    )
    assert len(past_faces([reach, hidden, inside], faces)) == 2


# -- no hubs ---------------------------------------------------------------------------------


def defined_names(path: Path) -> set[str]:
    """The names ``path`` defines at its top level (under if/try too), not those it imports."""
    names: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(
                node.target, ast.Name
            ):
                names.add(node.target.id)
            elif type(node).__name__ == "TypeAlias":  # `type X = ...`: Python 3.12 on
                names.add(node.name.id)  # type: ignore[attr-defined]
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(node.orelse)
                for handler in getattr(node, "handlers", ()):
                    visit(handler.body)

    visit(ast.parse(path.read_text()).body)
    return names


def declared_all(path: Path) -> set[str]:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return set(ast.literal_eval(node.value))
    return set()


def hubs(imports: Iterable[Import], defines: dict[str, set[str]], faces: set[str]) -> list[str]:
    """Imports that take a name from a module that does not define it (a face may)."""
    wrong = []
    for i in imports:
        if i.module in faces or i.module not in defines:
            continue
        if missing := sorted(set(i.names) - defines[i.module]):
            wrong.append(f"{i.importer}:{i.line} takes {missing} from {i.module}")
    return wrong


def _module_paths() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py") if not p.stem.endswith(GENERATED)}


def test_no_module_but_a_face_lists_a_name_it_does_not_define():
    paths = _module_paths()
    listed = {
        name: sorted(declared_all(path) - defined_names(path))
        for name, path in paths.items()
        if path.name != "__init__.py"
    }
    assert {name: extra for name, extra in listed.items() if extra} == {}


def test_every_import_takes_a_name_from_the_module_that_defines_it():
    paths = _module_paths()
    defines = {name: defined_names(path) for name, path in paths.items()}
    faces = {name for name, path in paths.items() if path.name == "__init__.py"}
    modules = all_modules()
    importers = [*corral_paths(), *ROOT.glob("tests/**/*.py"), *ROOT.glob("benchmarks/**/*.py")]
    imports = [
        i for path in importers for i in imports_of(path, modules, str(path.relative_to(ROOT)))
    ]
    assert len(imports) > 1000  # the walk found them
    assert hubs(imports, defines, faces) == []


def test_the_hub_check_finds_a_name_taken_from_where_it_is_not_defined():
    defines = {"corral._compute.scheduler": {"Scheduler"}, "corral._compute.queue": {"ModelQueue"}}
    via_hub = Import("x", "corral._compute.scheduler", ("ModelQueue",), False, 1)
    direct = Import("x", "corral._compute.queue", ("ModelQueue",), False, 2)
    face = Import("x", "corral._compute", ("ModelQueue",), False, 3)
    assert hubs([via_hub, direct, face], defines, {"corral._compute"}) == [
        "x:1 takes ['ModelQueue'] from corral._compute.scheduler"
    ]


# -- no cycle --------------------------------------------------------------------------------


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm)."""
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
        for other in sorted(graph.get(node, ())):
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


def _run_time_graph() -> dict[str, set[str]]:
    # A package's face re-exports its modules' names: importing a name through it is an
    # import of the module that defines it, not of the package's other modules.
    paths = _module_paths()
    faces = {name for name, path in paths.items() if path.name == "__init__.py"}
    graph: dict[str, set[str]] = {name: set() for name in paths}
    for i in corral_imports():
        if not i.type_checking and i.importer not in faces:
            graph[i.importer].add(i.module)
    return {name: targets - faces for name, targets in graph.items()}


def test_no_module_of_corral_is_in_an_import_cycle():
    graph = _run_time_graph()
    assert "corral.server.observe.status" in graph["corral.server.http.app"]  # the status query
    assert cycles(graph) == []


def test_no_folder_is_in_a_cycle_with_another_inside_any_folder():
    # Each folder's children (its modules and its subfolders) as nodes: an import of a module
    # deeper down counts as an import of the child that holds it.
    graph = _run_time_graph()
    folders = {module_name(p.parent) for p in PACKAGE.rglob("__init__.py")}
    found = {}
    for folder in folders:
        depth = folder.count(".") + 1
        children: dict[str, set[str]] = {}
        for importer, targets in graph.items():
            if not importer.startswith(folder + ".") or importer.count(".") < depth:
                continue
            child = ".".join(importer.split(".")[: depth + 1])
            for target in targets:
                if target.startswith(folder + ".") and target.count(".") >= depth:
                    other = ".".join(target.split(".")[: depth + 1])
                    if other != child:
                        children.setdefault(child, set()).add(other)
        if circles := cycles(children):
            found[folder] = circles
    assert found == {}


def test_the_cycle_check_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_core_imports_only_onnxruntime_numpy_and_the_standard_library():
    allowed = {"onnxruntime", "numpy", "corral", "google"}  # google: the generated _proto
    third_party: dict[str, set[str]] = {}
    for path in corral_paths():
        if layer_of(module_name(path)) not in (*CORE, "corral"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                tops = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                tops = {node.module.split(".")[0]}
            else:
                continue
            outside = {t for t in tops - allowed if t not in sys.stdlib_module_names}
            if outside:
                third_party.setdefault(module_name(path), set()).update(outside)
    # Imported lazily, each behind its extra's ImportError (model files, object storage, the
    # demo's builders): allowed by name, where they stand.
    lazily = {
        "corral._models.store": {"obstore"},
        "corral.testing": {"onnx"},
        "corral.demo": {"onnx", "psutil"},
        "corral._onnx.ort": {"onnxruntime_extensions"},
    }
    assert {m: found - lazily.get(m, set()) for m, found in third_party.items()} == {
        m: set() for m in third_party
    }
