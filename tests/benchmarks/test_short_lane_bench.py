"""benchmarks/short_lane.py keeps working: a quick run prints both modes' rows."""

from __future__ import annotations

from tests.helpers import run_benchmark


def test_a_quick_run_prints_both_modes_with_figures():
    done = run_benchmark("short_lane.py", ["--rounds", "1", "--tiny", "20", "--heavy-rows", "32"])
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines()[1:]]
    assert [row[0] for row in rows] == ["lane", "no-lane"], done.stdout
    for row in rows:
        alone, loaded, heavy = row[2].split("/"), row[3].split("/"), float(row[4])
        assert all(float(ms) > 0 for ms in alone + loaded)
        assert heavy > 0
