"""The real-model benchmark's quick mode, end to end: magika from its wheel, corral, ceiling."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ROOT, load_benchmark

BENCHMARKS = ROOT / "benchmarks"
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


def _document(corral_rate: float) -> dict[str, Any]:
    row = {"requests_per_s": corral_rate, "p50_ms": 5.0, "p99_ms": 9.0, "cpu_s_per_request": 0.01}
    row["vs_ceiling"] = corral_rate / 100
    peer = {"requests_per_s": 50.0, "p50_ms": 6.0, "p99_ms": 12.0, "cpu_s_per_request": 0.02}
    return {
        "date": "2026-12-01T00:00:00+00:00",
        "machine": {
            "cpus": 2,
            "platform": "Linux",
            "python": "3.11",
            "load_average_before": [1.0, 1.0, 1.0],
            "load_average_after": [2.0, 1.0, 1.0],
        },
        "versions": {"corral": "0.1.0", "wheels": ["magika==1.0.3"]},
        "settings": {"rounds": 1, "duration_s": 1.0},
        "models": [
            {
                "model": "magika",
                "wheel": "magika==1.0.3",
                "member": "magika/model.onnx",
                "inputs": "bytes",
                "tuned": "max_batch_size = 0",
                "json_body_bytes": 10,
                "targets": {
                    "corral": [{"connections": 8, "errors": 0, **row}],
                    "fastapi": [{"connections": 8, "errors": 0, **peer}],
                },
                "ceiling": {
                    "rows_per_s": 100.0,
                    "ways": {
                        "2 threads, batch 1": {
                            "rows_per_s": 100.0,
                            "cpu_s_per_row": 0.01,
                            "p50_ms": 1.0,
                            "p99_ms": 2.0,
                        }
                    },
                    "ms_per_row_one_thread": {"1": 8.0},
                },
                "skipped": {},
            }
        ],
        "mixed": None,
    }


@pytest.mark.timeout(60)
def test_render_replaces_its_own_section_and_keeps_the_rest_of_the_page(tmp_path: Path):
    real_models = load_benchmark("real_models.py")
    page = tmp_path / "benchmarks.md"
    page.write_text("# corral against the peers\n\nthe peers' figures\n")
    results = tmp_path / "real.json"
    results.write_text(json.dumps(_document(96.0)))
    real_models.render([results], tmp_path, with_plot=False)
    text = page.read_text()
    assert text.startswith("# corral against the peers\n\nthe peers' figures\n")
    assert "## Real models" in text
    assert (
        "8 connections, corral: 0.96x the ceiling (met); ahead of every peer in requests/s: yes"
        in text
    )
    page.write_text(page.read_text() + "\nWhere the time goes: written by hand.\n")
    results.write_text(json.dumps(_document(40.0)))
    real_models.render([results], tmp_path, with_plot=False)
    text = page.read_text()
    assert text.count("## Real models") == 1
    assert "0.96x" not in text
    assert (
        "8 connections, corral: 0.40x the ceiling (not met); ahead of every peer in requests/s: no"
        in text
    )
    assert text.endswith("\nWhere the time goes: written by hand.\n")
    assert not (tmp_path / "benchmarks-real.png").exists()  # matplotlib's import: seconds


@pytest.mark.timeout(60)
def test_corral_beside_triton_pairs_each_body_at_each_connection_count():
    real_models = load_benchmark("real_models.py")
    document = _document(60.0)
    model = document["models"][0]
    triton = {"requests_per_s": 50.0, "p50_ms": 6.0, "p99_ms": 12.0, "cpu_s_per_request": 0.008}
    model["targets"]["triton"] = [{"connections": 8, "errors": 0, **triton}]
    lines = real_models.triton_lines(model)
    assert lines[-1] == "| corral / triton | 8 | 1.20x | 9.0 / 12.0 | 10,000 / 8,000 |"
    assert len(lines) == 3  # header, rule, JSON: corral-binary and triton-binary were not run
    assert "| corral / triton | 8 | 1.20x |" in real_models.format_report(document)
    # Triton is a peer in the goals: 60 requests/s is ahead of its 50.
    assert any(
        "ahead of every peer in requests/s: yes" in line for line in real_models.goals(document)
    )
    del model["targets"]["triton"]
    assert real_models.triton_lines(model) == []
