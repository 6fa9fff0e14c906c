"""benchmarks/arrival_order.py keeps working: a quick run prints both sides' rounds."""

from __future__ import annotations

import re

from tests.helpers import run_benchmark


def test_a_quick_run_prints_each_side_and_the_medians():
    argv = ["--before", "HEAD", "--rounds", "1", "--seconds", "0.5", "--callers", "4"]
    done = run_benchmark("arrival_order.py", argv, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("mlp, pool:1, max_batch_size 0, 2 compute workers"), lines
    rounds = [line for line in lines if line.startswith("round 1 ")]
    assert [line.split()[2] for line in rounds] == ["before", "after"], done.stdout
    figures = re.compile(r"(\d+) req/s .* p99 +([\d.]+) +max +([\d.]+)")
    for line in rounds:
        found = figures.search(line)
        assert found is not None, line
        rate, p99, longest = found.groups()
        assert int(rate) > 0
        assert 0 < float(p99) <= float(longest)
    assert "medians of the rounds:" in lines
