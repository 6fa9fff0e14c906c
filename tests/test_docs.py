"""The thread-safety contract names only tests that exist."""

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
    named = re.findall(r"`(test_\w+\.py)::(test_\w+)`", text)
    assert len(named) >= 30
    # A file is named without its folder: tests/ or tests/reliability/. Each is parsed once,
    # not once per test the contract names in it (173 parses took 5 s).
    files = {path.name: path for path in (ROOT / "tests").rglob("test_*.py")}
    named_files = {file for file, _ in named if file in files}
    tests = {file: _tests_in(files[file]) for file in named_files}
    missing = [f"{file}::{name}" for file, name in named if name not in tests.get(file, ())]
    assert not missing, missing


def test_the_contract_lists_every_provider_in_the_table():
    from corral import PROVIDER_TABLE

    text = (ROOT / "docs" / "thread-safety.md").read_text()
    for provider in PROVIDER_TABLE:
        assert f"| {provider} |" in text, provider
