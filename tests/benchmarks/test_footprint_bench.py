"""benchmarks/footprint.py: the repository it builds, its workers, its tables, its commands.

Every worker loads models in its own process, so nothing here starts onnxruntime's global
pools in the test process; the whole benchmark runs in a subprocess too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import psutil
import pytest

import corral
from corral.demo import WorkerFailed
from tests.helpers import BENCHMARKS, load_benchmark, run_benchmark

footprint = load_benchmark("footprint.py")
ENGINES = footprint.ENGINES
FootprintResult = footprint.FootprintResult
build_repository = footprint.build_repository
format_table = footprint.format_table
measure_footprint = footprint.measure_footprint
parse_counts = footprint.parse_counts
run_footprint_worker = footprint.run_footprint_worker
summary_rows = footprint.summary_rows
SCRIPT = str(BENCHMARKS / "footprint.py")

COUNT = 10
# Leaves a worker's own hard timeout room to report before pytest-timeout fires.
WORKER_TIMEOUT_S = 100.0
# onnxruntime sizes a default session's intra-op pool to the physical cores, the caller's
# thread being one of them: with one core a default session starts no thread at all.
MULTICORE = (psutil.cpu_count(logical=False) or 1) >= 2 and (os.cpu_count() or 1) >= 2


@pytest.fixture(scope="module")
def footprint_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The benchmark's own repository of COUNT models, shared by the module."""
    root = tmp_path_factory.mktemp("repo")
    build_repository(root, COUNT)
    return root


# -- the repository -------------------------------------------------------------------------


def test_build_repository_lays_models_out_as_triton_does(tmp_path: Path) -> None:
    reported: list[int] = []

    paths = build_repository(tmp_path, 7, progress=reported.append)

    names = [f"m{n:05d}" for n in range(1, 8)]
    assert paths == [tmp_path / name / "1" / "model.onnx" for name in names]
    assert reported == list(range(1, 8))
    entries = corral.Repository(tmp_path).scan()
    assert list(entries) == names
    assert all(entry.error is None and list(entry.versions) == [1] for entry in entries.values())
    kinds = [onnx.load(path).graph.name for path in paths]
    assert kinds == ["tree", "linear", "mlp", "tree", "linear", "mlp", "tree"]
    with corral.Session(paths[2]) as session:
        assert session.run({"X": np.ones((1, 4), np.float32)})["Y"].shape == (1, 1)


def test_build_repository_is_deterministic_and_refuses_no_models(tmp_path: Path) -> None:
    first = build_repository(tmp_path / "a", 3)
    second = build_repository(tmp_path / "b", 3)

    assert [p.read_bytes() for p in first] == [p.read_bytes() for p in second]
    with pytest.raises(ValueError, match="at least 1"):
        build_repository(tmp_path / "c", 0)


# -- the workers ----------------------------------------------------------------------------


@pytest.mark.timeout(300)
@pytest.mark.parametrize("engine", ENGINES)
def test_worker_prints_one_json_line_of_sane_figures(footprint_repo: Path, engine: str) -> None:
    command = [
        sys.executable,
        SCRIPT,
        "worker",
        f"--engine={engine}",
        f"--repo={footprint_repo}",
        f"--count={COUNT}",
    ]

    completed = subprocess.run(
        command, capture_output=True, text=True, timeout=WORKER_TIMEOUT_S, check=False
    )

    # Exits at once through os._exit, yet the line is flushed first.
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.splitlines()
    assert len(lines) == 1, completed.stdout
    result = json.loads(lines[0])
    assert set(result) == set(FootprintResult.__annotations__)
    assert (result["engine"], result["count"], result["ok_runs"]) == (engine, COUNT, COUNT)
    assert result["threads_before"] >= 1
    assert result["rss_after"] > result["rss_before"] > 0
    assert result["rss_per_model"] == pytest.approx(
        (result["rss_after"] - result["rss_before"]) / COUNT
    )
    assert result["load_seconds"] > 0


@pytest.mark.timeout(300)
@pytest.mark.parametrize("engine", ["corral-host", "onnxruntime-global"])
def test_global_pools_add_no_thread_per_model(footprint_repo: Path, engine: str) -> None:
    result = run_footprint_worker(engine, footprint_repo, COUNT, timeout=WORKER_TIMEOUT_S)

    assert result["ok_runs"] == COUNT
    assert result["threads_after"] - result["threads_before"] <= 3, result


@pytest.mark.timeout(300)
@pytest.mark.skipif(not MULTICORE, reason="a default session has no pool thread on one core")
def test_default_sessions_add_a_thread_per_model(footprint_repo: Path) -> None:
    result = run_footprint_worker(
        "onnxruntime-default", footprint_repo, COUNT, timeout=WORKER_TIMEOUT_S
    )

    assert result["ok_runs"] == COUNT
    assert result["threads_after"] - result["threads_before"] >= COUNT, result


@pytest.mark.timeout(300)
def test_worker_asked_for_more_models_than_the_repository_holds_fails(footprint_repo: Path) -> None:
    with pytest.raises(WorkerFailed, match=rf"holds {COUNT} models, fewer than {COUNT + 1}"):
        run_footprint_worker("corral-host", footprint_repo, COUNT + 1, timeout=WORKER_TIMEOUT_S)


@pytest.mark.timeout(60)
def test_worker_over_its_timeout_is_killed(footprint_repo: Path) -> None:
    # No interpreter starts, let alone loads 20 models, within a millisecond.
    with pytest.raises(WorkerFailed, match=r"did not finish within 0\.001s"):
        run_footprint_worker("onnxruntime-global", footprint_repo, COUNT, timeout=0.001)


# -- the whole measurement ------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_measure_footprint_runs_every_engine_per_count_in_order() -> None:
    events: list[tuple[str, int, int]] = []

    def on_progress(step: str, done: int, total: int) -> None:
        events.append((step, done, total))

    results = measure_footprint((6, 3, 6), on_progress, timeout=WORKER_TIMEOUT_S)

    assert [(r["count"], r["engine"]) for r in results] == [
        (count, engine) for count in (3, 6) for engine in ENGINES
    ]
    assert all(r["ok_runs"] == r["count"] for r in results)
    assert [event for event in events if event[0] == "build"] == [
        ("build", done, 6) for done in range(1, 7)
    ]
    assert [event for event in events if event[0] != "build"] == [
        (engine, done, count) for count in (3, 6) for engine in ENGINES for done in (0, count)
    ]


def test_measure_footprint_refuses_no_counts() -> None:
    with pytest.raises(ValueError, match="positive"):
        measure_footprint(())
    with pytest.raises(ValueError, match="positive"):
        measure_footprint((0, 5))


def test_parse_counts() -> None:
    assert parse_counts("10000,100, 1000,100") == (100, 1000, 10000)
    for bad in ("", "10,x", "10,-1", "0"):
        with pytest.raises(ValueError, match="positive integers"):
            parse_counts(bad)


# -- the table ------------------------------------------------------------------------------


def fake_result(engine: str, count: int, threads: int, kib: float) -> FootprintResult:
    return FootprintResult(
        engine=engine,
        count=count,
        threads_before=3,
        threads_after=threads,
        rss_before=1 << 20,
        rss_after=(1 << 20) + int(kib * 1024 * count),
        rss_per_model=kib * 1024,
        load_seconds=count / 1000,
        ok_runs=count,
    )


def test_summary_rows_put_engines_side_by_side_per_count() -> None:
    results = [
        fake_result("onnxruntime-default", 1000, 1003, 200.0),
        fake_result("corral-host", 1000, 3, 80.0),
        fake_result("corral-host", 100, 3, 90.5),
    ]

    rows = summary_rows(results)

    assert rows == [
        ["100", "threads", "3", "-", "-"],
        ["", "RSS per model (KiB)", "90.5", "-", "-"],
        ["", "load time (s)", "0.10", "-", "-"],
        ["1,000", "threads", "3", "1,003", "-"],
        ["", "RSS per model (KiB)", "80.0", "200.0", "-"],
        ["", "load time (s)", "1.00", "1.00", "-"],
    ]
    text = format_table(results)
    assert text.splitlines()[0].split() == ["models", *ENGINES]
    assert "1,003" in text


# -- the command line -----------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_script_prints_json_for_every_engine_instead_of_the_table() -> None:
    completed = run_benchmark("footprint.py", ["--counts", "10", "--json"], timeout=250)

    assert completed.returncode == 0, completed.stderr
    results = json.loads(completed.stdout)
    assert [(r["engine"], r["count"], r["ok_runs"]) for r in results] == [
        (engine, 10, 10) for engine in ENGINES
    ]


@pytest.mark.timeout(300)
def test_script_draws_the_table_and_writes_json_to_a_file(tmp_path: Path) -> None:
    written = tmp_path / "density.json"

    # One count, three workers: ordering several counts is measure_footprint's test's, and
    # summary_rows's test draws several counts side by side.
    completed = subprocess.run(
        [sys.executable, SCRIPT, "--counts", "4", "--json", str(written)],
        capture_output=True,
        text=True,
        timeout=250,
        check=False,
        env={**os.environ, "COLUMNS": "120"},
    )

    assert completed.returncode == 0, completed.stderr
    for expected in ("threads", "RSS per model (KiB)", "load time (s)", "onnxruntime"):
        assert expected in completed.stdout
    assert "building 4 models" in completed.stderr
    assert f"results written to {written}" in completed.stderr
    results = json.loads(written.read_text())
    assert [(r["count"], r["engine"]) for r in results] == [(4, engine) for engine in ENGINES]


def test_without_rich_the_table_is_plain_text(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A None entry in sys.modules makes the import machinery treat rich as absent.
    monkeypatch.setitem(sys.modules, "rich", None)
    results = [fake_result("corral-host", 100, 3, 90.5)]

    footprint._print_table(results)

    assert capsys.readouterr().out == format_table(results) + "\n"


def test_without_rich_progress_is_a_line_per_step(capsys: pytest.CaptureFixture[str]) -> None:
    for step, done, total in [("build", 999, 2500), ("build", 1000, 2500), ("build", 2500, 2500)]:
        footprint._report_line(step, done, total)
    footprint._report_line("corral-host", 0, 2500)
    footprint._report_line("corral-host", 2500, 2500)

    assert capsys.readouterr().err.splitlines() == [
        "built 1,000 of 2,500 models",
        "built 2,500 of 2,500 models",
        "corral-host: loading 2,500 models ...",
    ]


@pytest.mark.timeout(120)
def test_repository_command_writes_the_models_make_serve_serves(tmp_path: Path) -> None:
    root = tmp_path / "demo-models"

    completed = subprocess.run(
        [sys.executable, SCRIPT, "repository", str(root), "--count", "4"],
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )

    assert completed.returncode == 0, completed.stderr
    assert corral.Repository(root).names() == ["m00001", "m00002", "m00003", "m00004"]
    # The very models the benchmark measures, laid out the same way.
    expected = build_repository(tmp_path / "expected", 4)
    assert [(root / p.relative_to(tmp_path / "expected")).read_bytes() for p in expected] == [
        p.read_bytes() for p in expected
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--counts", "10,zero"], "argument --counts: model counts must be positive integers"),
        (["worker", "--engine", "tensorflow"], "argument --engine: invalid choice"),
        (["repository", "dir", "--count", "0"], "argument --count: must be a positive integer"),
    ],
)
def test_script_refuses_bad_arguments(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        footprint.main(argv)

    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
