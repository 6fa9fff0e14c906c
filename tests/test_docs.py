"""The docs: the thread-safety contract names only tests that exist; no merge leftovers."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _tests_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
    }


def test_every_test_named_in_the_contract_exists():
    text = (ROOT / "docs" / "thread-safety.md").read_text()
    named = re.findall(r"`((?:[\w.-]+/)*test_\w+\.py)::(test_\w+)`", text)
    assert len(named) >= 30
    # A file is named by its name alone (found under tests/), or by its path from the
    # repository's root (edge/tests/...). Each is parsed once, not once per test the contract
    # names in it (173 parses took 5 s).
    files = {path.name: path for path in (ROOT / "tests").rglob("test_*.py")}
    files |= {file: ROOT / file for file, _ in named if "/" in file and (ROOT / file).is_file()}
    named_files = {file for file, _ in named if file in files}
    tests = {file: _tests_in(files[file]) for file in named_files}
    missing = [f"{file}::{name}" for file, name in named if name not in tests.get(file, ())]
    assert not missing, missing


def test_the_contract_lists_every_provider_in_the_table():
    from corral import PROVIDER_TABLE

    text = (ROOT / "docs" / "thread-safety.md").read_text()
    for provider in PROVIDER_TABLE:
        assert f"| {provider} |" in text, provider


# A merge's conflict markers, each at the start of a line: ours, the base (diff3), the
# divider, theirs. A setext heading underlined with exactly seven '=' would be refused too:
# underline with another length.
_CONFLICT_MARKER = re.compile(r"^(?:<{7}(?: |$)|\|{7}(?: |$)|={7}$|>{7}(?: |$))", re.MULTILINE)


def conflict_markers(text: str) -> list[int]:
    """The line numbers (from 1) of the merge-conflict markers in ``text``."""
    return [text.count("\n", 0, found.start()) + 1 for found in _CONFLICT_MARKER.finditer(text)]


def test_no_document_holds_a_merge_conflict_marker():
    documents = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]
    assert len(documents) >= 10
    found = {
        str(path.relative_to(ROOT)): lines
        for path in documents
        if (lines := conflict_markers(path.read_text()))
    }
    assert not found, f"merge-conflict markers (file: lines): {found}"


def test_the_marker_check_finds_each_kind_and_nothing_else():
    text = (
        "# Title\n<<<<<<< HEAD\nours\n||||||| base\nold\n=======\ntheirs\n>>>>>>> branch\n"
        "Heading\n========\n`<<<<<<<` quoted\n a ======= inside\n"
    )
    assert conflict_markers(text) == [2, 4, 6, 8]
