"""benchmarks/reuseport.py: its launcher shares one port between processes; its table is right.

Without wrk: the groups' servers are started and checked as the benchmark does (every answer
equal to onnxruntime's), and the table is built from canned runs.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import load_benchmark

reuseport = load_benchmark("reuseport.py")


def _listening_sockets(port: int) -> int:
    # /proc/net/tcp: local address as HEXIP:HEXPORT, state 0A is LISTEN.
    lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return sum(
        1 for line in lines if line.split()[1].endswith(f":{port:04X}") and line.split()[3] == "0A"
    )


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux's /proc/net/tcp")
def test_two_launched_servers_listen_on_one_port_and_answer_like_onnxruntime(
    tmp_path: Path,
) -> None:
    repository = tmp_path / "models"
    reuseport.build_repository(repository)
    models = reuseport.models(repository)
    with reuseport.running_group("2x1", 2, 1, repository, tmp_path, models) as group:
        # running_group has checked every model's answer on connections spread over both.
        assert len(set(group.pids)) == 2
        assert _listening_sockets(group.port) == 2
        for pid in group.pids:
            assert reuseport.cpu_seconds(pid) >= 0
    assert _listening_sockets(group.port) == 0


def test_cpu_seconds_reads_this_process_and_never_goes_down() -> None:
    first = reuseport.cpu_seconds(os.getpid())
    sum(range(100_000))
    assert reuseport.cpu_seconds(os.getpid()) >= first > 0


def test_groups_parse_and_bad_ones_are_refused_by_name() -> None:
    assert reuseport.parse_groups("1x2, 2x1,1x1") == [(1, 2), (2, 1), (1, 1)]
    for bad in ("1x2", "1x2,1x2"):
        with pytest.raises(ValueError, match="two groups or more, each once"):
            reuseport.parse_groups(bad)
    for bad, named in (("2,1x2", "'2'"), ("0x1,1x1", "'0x1'"), ("1xa,1x1", "'1xa'")):
        with pytest.raises(ValueError, match=f"{named} is not PROCESSESxWORKERS"):
            reuseport.parse_groups(bad)


def _run(model: str, group: str, round_index: int, rate: float, shares: list[float]) -> dict:
    return {
        "model": model,
        "group": group,
        "round": round_index,
        "requests_per_s": rate,
        "p50_ms": 1.0,
        "p99_ms": 2.0,
        "server_cores": 1.0,
        "client_cores": 0.5,
        "cpu_us_per_request": 70.0,
        "cpu_share": shares,
    }


def test_the_table_gives_medians_and_each_rounds_ratio_to_the_first_group() -> None:
    runs = [
        _run("tiny", "1x2", 0, 100.0, [1.0]),
        _run("tiny", "2x1", 0, 150.0, [0.4, 0.6]),
        _run("tiny", "1x2", 1, 200.0, [1.0]),
        _run("tiny", "2x1", 1, 100.0, [0.5, 0.5]),
    ]
    table = reuseport.report(runs, ["1x2", "2x1"], ["tiny"]).splitlines()
    assert "vs 1x2 (each round)" in table[0]
    baseline, two = table[2], table[3]
    assert "| tiny | 1x2 | 150 |" in baseline
    assert "| 1.00 1.00 |" in baseline
    # Ratios are per round (1.50, then 0.50), not the ratio of the medians (1.0).
    assert "| tiny | 2x1 | 125 |" in two
    assert "| 1.50 0.50 |" in two
    assert two.endswith("| 0.45 / 0.55 |")
