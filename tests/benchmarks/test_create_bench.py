"""benchmarks/create.py: its measurement, its table and its command line.

The measurements here are tiny (a few dozen sessions, one or two rounds): they check the
harness, not the figures.
"""

from __future__ import annotations

import json

import pytest

import corral
from tests.helpers import load_benchmark, run_benchmark

create = load_benchmark("create.py")


def test_measure_construction_closes_what_it_creates() -> None:
    alive_before = corral.runtime().stats().sessions_alive
    reported: list[tuple[str, int, int]] = []

    result = create.measure_construction(
        6, threads=2, rounds=2, progress=lambda *a: reported.append(a)
    )

    assert len(result["serial_seconds"]) == len(result["parallel_seconds"]) == 2
    assert reported[:6] == [("build", n, 6) for n in range(1, 7)]
    assert reported[6:] == [("measure", n, 4) for n in range(1, 5)]
    assert corral.runtime().stats().sessions_alive == alive_before


@pytest.mark.parametrize("name", ["n_models", "threads", "rounds"])
def test_measure_construction_refuses_nothing_to_measure(name: str) -> None:
    with pytest.raises(ValueError, match=f"{name} must be at least 1, got 0"):
        create.measure_construction(**{"n_models": 2, "threads": 1, "rounds": 1, name: 0})


@pytest.mark.timeout(150)
def test_script_prints_json_in_a_subprocess() -> None:
    argv = ["--models", "20", "--rounds", "1", "--json"]

    completed = run_benchmark("create.py", argv, timeout=100)

    assert completed.returncode == 0, completed.stderr
    result = json.loads(completed.stdout)
    assert (result["models"], result["threads"], result["rounds"]) == (20, 4, 1)
    assert len(result["serial_seconds"]) == len(result["parallel_seconds"]) == 1
    assert result["serial_median"] > 0
    assert result["parallel_median"] > 0
    assert result["ratio"] == pytest.approx(result["parallel_median"] / result["serial_median"])
    assert result["policy"] == "shared"


@pytest.mark.timeout(150)
def test_script_draws_the_table_and_reports_progress(capsys: pytest.CaptureFixture[str]) -> None:
    assert create.main(["--models", "6", "--threads", "2", "--rounds", "1"]) == 0

    captured = capsys.readouterr()
    assert "Creating 6 sessions, 1 round(s)" in captured.out
    assert "parallel (2 threads)" in captured.out
    assert "building 6 models" in captured.err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rounds", "0"], "argument --rounds: must be a positive integer, got 0"),
        (["--models", "many"], "argument --models: must be a positive integer, got 'many'"),
    ],
)
def test_script_refuses_bad_arguments(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        create.main(argv)

    assert exited.value.code == 2
    assert message in capsys.readouterr().err
