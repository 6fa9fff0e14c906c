"""The real-model benchmark's quick mode, end to end: magika from its wheel, corral, ceiling."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
_EXIT_UNAVAILABLE = 3  # real_models.EXIT_UNAVAILABLE: the wheels could not be fetched


@pytest.mark.timeout(240)
def test_the_quick_run_serves_magika_checked_and_measures_it_against_the_ceiling(tmp_path: Path):
    if shutil.which("wrk") is None:
        pytest.skip("wrk is not installed (Debian package wrk; make test installs it)")
    results = tmp_path / "real.json"
    command = [
        sys.executable,
        str(BENCHMARKS / "real_models.py"),
        "--quick",
        "--json",
        str(results),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=200, check=False)
    if done.returncode == _EXIT_UNAVAILABLE:
        pytest.skip(f"the magika wheel could not be downloaded from PyPI: {done.stderr[-500:]}")
    assert done.returncode == 0, done.stdout + done.stderr
    document = json.loads(results.read_text())
    (model,) = document["models"]
    assert model["model"] == "magika"
    assert model["wheel"] == "magika==1.0.3"
    (row,) = model["targets"]["corral"]
    assert row["connections"] == 8
    assert row["requests_per_s"] > 0
    assert row["errors"] == 0
    assert row["cpu_s_per_request"] > 0
    ceiling = model["ceiling"]
    assert ceiling["rows_per_s"] == max(way["rows_per_s"] for way in ceiling["ways"].values())
    assert set(ceiling["ms_per_row_one_thread"]) == {"1", "8", "32"}
    assert "| corral | 8 |" in done.stdout
