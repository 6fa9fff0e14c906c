"""benchmarks/cold_start.py keeps working: on the tiny kinds, a row per kind with its ratio."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.helpers import run_benchmark

_TINY = ("tree", "linear", "mlp")


@pytest.mark.timeout(180)
def test_a_short_run_on_the_tiny_kinds_prints_a_row_per_kind_with_its_ratio(tmp_path: Path):
    results = tmp_path / "cold.json"
    argv = ["--kinds", ",".join(_TINY), "--rounds", "2", "--warm", "3", "--json", str(results)]
    done = run_benchmark("cold_start.py", argv, timeout=150)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ")][1:]
    assert [row.split("|")[1].strip() for row in rows] == list(_TINY), done.stdout
    for row in rows:
        cells = [cell.strip() for cell in row.split("|")[2:-1]]
        # Five figures (ms), the two ratios, then the verdict; the values are not asserted.
        assert len(cells) == 8, row
        assert all(re.fullmatch(r"\d+\.\d+", cell) for cell in cells[:7]), row
        assert cells[7] in {"met", "NOT met"}, row
    document = json.loads(results.read_text())
    assert [row["kind"] for row in document["summary"]] == list(_TINY)
    for kind in document["kinds"]:
        assert len(kind["cold_s"]) == len(kind["load_s"]) == len(kind["cold_server_s"]) == 2
        assert len(kind["warm_s"]) == 2 * 3
    assert document["command"].startswith("python benchmarks/cold_start.py --kinds tree")
