"""Count the tests' uses of corral privates: they only go down (tests/test_reach_ins.py).

A use is one of:
  A. an attribute ``x._name`` (one leading underscore, not a dunder) read or written on a
     corral object (host._table, lease._served, host._table._ready ...): every such
     Attribute node counts, so host._table._ready is two uses;
  B. a private corral function/class/global reached through its module
     (``http_codec._plain_request``, ``_scheduler._partition``);
  C. a private name imported from corral (``from corral._host.loader import _choose``).
Not counted: importing or naming a corral module, private or not (``from corral._host.table
import ModelTable``, ``corral._host.loader`` itself): the pieces have no other home, and a
test of ModelTable must import it. Module-level patching (``monkeypatch.setattr(
corral._host.loader, "Session", ...)``) is listed apart, as "patches", and not counted.
Not corral, so not counted: ``self._x``/``cls._x`` (the tests' own helper classes) and anything
reached from a non-corral module (os._exit, prometheus_client.REGISTRY._names_to_collectors),
and the objects named in NOT_CORRAL below.

Run from the repository root, with corral importable (its modules are told apart from its
other names by importing their specs)::

    PYTHONPATH=$PWD python scripts/count_test_reach_ins.py [--list]
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from collections import Counter
from pathlib import Path

# Names in tests bound to objects that are not corral's (checked by reading each use).
NOT_CORRAL = {
    "self",
    "cls",
    # argparse parsers (their _actions)
    "parser",
    "serve",
    "commands",
    "_parser",
    # benchmarks/ scripts (tests.helpers.load_benchmark)
    "footprint",
    "scenarios",
    "http_bench",
    "routed",  # test_ray_units.py's DirectHandle, a test double, in its own method
}


def _private(attr: str) -> bool:
    return attr.startswith("_") and not attr.startswith("__")


def _is_module(dotted: str) -> bool:
    try:
        return importlib.util.find_spec(dotted) is not None
    except (ImportError, ValueError):
        return False


def _dotted(node: ast.expr, modules: dict[str, str]) -> str | None:
    """The module path ``node`` names, if it is a module (``corral._host.loader``), else None."""
    if isinstance(node, ast.Name):
        return modules.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value, modules)
        if base is not None and _is_module(f"{base}.{node.attr}"):
            return f"{base}.{node.attr}"
    return None


def _root(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute | ast.Call | ast.Subscript):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def scan(path: Path) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """The uses of corral privates in one file, and its patches of corral modules."""
    tree = ast.parse(path.read_text(), str(path))
    modules: dict[str, str] = {}
    uses: list[tuple[int, str]] = []
    patches: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    modules[alias.asname] = alias.name
                else:
                    modules[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if _is_module(full):
                    modules[alias.asname or alias.name] = full
                elif node.module.split(".")[0] == "corral" and _private(alias.name):
                    uses.append((node.lineno, f"from {node.module} import {alias.name}"))
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not _private(node.attr):
            continue
        module = _dotted(node.value, modules)
        text = ast.unparse(node)
        if module is not None:
            if module.split(".")[0] == "corral" and not _is_module(f"{module}.{node.attr}"):
                uses.append((node.lineno, text))  # B: a private name of a corral module
            continue
        if _dotted(node, modules) is not None:
            continue  # a module itself (corral._host.loader)
        root = _root(node.value)
        if root in NOT_CORRAL or (root in modules and not modules[root].startswith("corral")):
            continue  # not corral's: a test's own object, or a non-corral module's
        uses.append((node.lineno, text))  # A
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and ast.unparse(node.func).endswith("setattr")
            and node.args
            and (_dotted(node.args[0], modules) or "").startswith("corral")
        ):
            patches.append((node.lineno, ast.unparse(node)[:90]))
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Attribute) and (
                    _dotted(target.value, modules) or ""
                ).startswith("corral"):
                    patches.append((node.lineno, ast.unparse(target)))
    return sorted(uses), sorted(patches)


def main() -> None:
    """Print the uses per file and their total; ``--list`` first lists each one."""
    show = "--list" in sys.argv
    files: Counter[str] = Counter()
    total_patches = 0
    for path in sorted(Path("tests").rglob("*.py")):
        uses, patches = scan(path)
        total_patches += len(patches)
        if uses:
            files[str(path)] = len(uses)
        if show:
            for line, text in uses:
                print(f"{path}:{line}: {text}")
            for line, text in patches:
                print(f"{path}:{line}: (patch) {text}")
    for name, count in sorted(files.items()):
        print(f"{count:4d} {name}")
    print(
        f"uses: {sum(files.values())} in {len(files)} files; module patches (not counted): "
        f"{total_patches}"
    )


if __name__ == "__main__":
    main()
