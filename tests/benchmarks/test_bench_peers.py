"""The peer benchmark's quick variant, end to end: two peers, a skipped one, the page."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

BENCHMARKS = ROOT / "benchmarks"


@pytest.mark.timeout(300)
def test_the_quick_run_measures_each_peer_reports_the_skipped_and_renders(tmp_path: Path):
    if shutil.which("wrk") is None:
        pytest.skip("wrk is not installed (Debian package wrk; make test installs it)")
    results = tmp_path / "peers.json"
    command = [
        sys.executable,
        str(BENCHMARKS / "bench_peers.py"),
        "--quick",
        "--peers",
        "corral,fastapi,nonesuch",
        # One concurrency: each is a second of wrk per peer and distribution, and the summary,
        # the medians and the page are the same code for one as for several.
        "--concurrency",
        "4",
        "--duration",
        "1",
        "--json",
        str(results),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    document = json.loads(results.read_text())
    assert [peer["peer"] for peer in document["peers"]] == ["corral", "fastapi"]
    for peer in document["peers"]:
        cells = {(row["distribution"], row["connections"]) for row in peer["summary"]}
        assert cells == {("uniform", 4), ("zipf", 4)}
        assert all(row["requests_per_s"] > 0 and row["errors"] == 0 for row in peer["summary"])
        assert peer["threads"] > 0
        assert peer["rss_bytes"] > 0
    assert "missing" in document["skipped"]["nonesuch"]

    render = [sys.executable, str(BENCHMARKS / "render_peers.py"), str(results)]
    done = subprocess.run(
        [*render, "--out", str(tmp_path)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    page = (tmp_path / "benchmarks.md").read_text()
    assert "| corral |" in page
    assert "| vs fastapi |" in page
    assert "| nonesuch | skipped:" in page
    assert (tmp_path / "benchmarks-throughput.png").stat().st_size > 0
