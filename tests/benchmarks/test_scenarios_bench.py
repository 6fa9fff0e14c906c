"""benchmarks/scenarios.py: its rows, its ratios, its plot and its command line.

The measurements here are tiny (a few dozen requests, one or two callers, one round): they
check the harness, not the figures.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

import corral
from tests.helpers import load_benchmark, run_benchmark

scenarios = load_benchmark("scenarios.py")
BASELINES = scenarios.BASELINES
SCENARIO_MODELS = scenarios.SCENARIO_MODELS
VARIANTS = scenarios.VARIANTS
ScenarioRow = scenarios.ScenarioRow
build_scenario_model = scenarios.build_scenario_model
plot_scenarios = scenarios.plot_scenarios
run_scenarios = scenarios.run_scenarios
unavailable_variants = scenarios.unavailable_variants
main = scenarios.main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CORRAL_VARIANTS = [variant for variant in VARIANTS if variant not in BASELINES]


@pytest.fixture
def tree_rows() -> tuple[list[ScenarioRow], list[tuple[str, int, int]]]:
    reported: list[tuple[str, int, int]] = []

    rows = run_scenarios(
        ("tree",), (1, 2), requests=20, rounds=1, progress=lambda *a: reported.append(a)
    )

    return rows, reported


def by_variant(rows: list[ScenarioRow], model: str, concurrency: int) -> dict[str, ScenarioRow]:
    return {
        row["variant"]: row
        for row in rows
        if row["model"] == model and row["concurrency"] == concurrency
    }


# -- the models -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "features", "nodes"),
    [("tree", 4, 15), ("forest", 8, 100 * 127), ("mlp", 4, None)],
)
def test_scenario_models_are_the_ones_the_issue_names(
    model: str, features: int, nodes: int | None
) -> None:
    graph = onnx.load_from_string(build_scenario_model(model)).graph

    assert graph.input[0].type.tensor_type.shape.dim[1].dim_value == features
    if nodes is not None:
        (ensemble,) = graph.node
        node_ids = next(a for a in ensemble.attribute if a.name == "nodes_nodeids")
        assert len(node_ids.ints) == nodes
    with corral.Session(build_scenario_model(model)) as session:
        assert session.run({"X": np.ones((1, features), np.float32)})["Y"].shape == (1, 1)


def test_unknown_model_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown model 'oak'"):
        build_scenario_model("oak")


# -- the rows -------------------------------------------------------------------------------


def test_one_row_per_model_concurrency_and_variant(tree_rows: Any) -> None:
    rows, _ = tree_rows

    assert [(r["model"], r["concurrency"], r["variant"]) for r in rows] == [
        ("tree", concurrency, variant) for concurrency in (1, 2) for variant in VARIANTS
    ]
    for row in rows:
        assert set(row) == set(ScenarioRow.__annotations__)
        assert row["requests"] == 20


def test_baselines_ran_and_corral_ratios_are_over_the_better_of_them(tree_rows: Any) -> None:
    rows, _ = tree_rows

    for concurrency in (1, 2):
        variants = by_variant(rows, "tree", concurrency)
        best = max(variants[v]["requests_per_s"] for v in BASELINES)
        for variant in BASELINES:
            row = variants[variant]
            assert row["requests_per_s"] > 0
            assert row["rounds"] == [row["requests_per_s"]]
            assert (row["ratio"], row["unavailable"]) == (None, None)
        for variant in CORRAL_VARIANTS:
            row = variants[variant]
            assert row["baseline"] == best
            if row["unavailable"] is None:
                assert row["requests_per_s"] > 0
                assert row["ratio"] == pytest.approx(row["requests_per_s"] / best)
            else:
                assert (row["requests_per_s"], row["ratio"], row["rounds"]) == (None, None, [])


def test_progress_counts_every_timed_run(tree_rows: Any) -> None:
    _, reported = tree_rows
    ran = len(VARIANTS) - len(unavailable_variants())
    total = 2 * ran

    assert [(done, of) for _, done, of in reported] == [(n, total) for n in range(1, total + 1)]
    assert reported[0][0].startswith("tree, 1 caller: ")
    assert reported[-1][0].startswith("tree, 2 callers: ")


def test_every_round_is_kept_and_the_median_reported() -> None:
    rows = run_scenarios(("mlp",), (2,), requests=10, rounds=3)

    for row in rows:
        if row["unavailable"] is None:
            assert len(row["rounds"]) == 3
            assert row["requests_per_s"] == statistics.median(row["rounds"])


def test_every_model_runs() -> None:
    rows = run_scenarios(SCENARIO_MODELS, (1,), requests=4, rounds=1)

    assert [row["model"] for row in rows] == [m for m in SCENARIO_MODELS for _ in VARIANTS]
    assert all(row["requests_per_s"] for row in rows if row["variant"] in BASELINES)


# -- variants the Host cannot run yet -------------------------------------------------------


class HostBeforeTheScheduler:
    def __init__(self, repository: object, *, memory_budget: object = None) -> None:
        pass

    def infer(self, name: str, inputs: object) -> object:
        return None


class HostWithTheScheduler(HostBeforeTheScheduler):
    def __init__(self, repository: object, *, batching: bool = True) -> None:
        pass

    async def infer_async(self, name: str, inputs: object) -> object:
        return None


def test_variants_a_host_cannot_run_are_named_with_a_reason() -> None:
    assert unavailable_variants(HostBeforeTheScheduler) == {
        "corral-blocking-batched": "corral.Host takes no batching= argument yet",
        "corral-async-batched": "corral.Host takes no batching= argument yet",
        "corral-async": "corral.Host has no infer_async yet",
    }
    assert unavailable_variants(HostWithTheScheduler) == {}


def test_unavailable_variants_report_none_and_why(monkeypatch: pytest.MonkeyPatch) -> None:
    missing = {"corral-async": "no loop today", "corral-async-batched": "no loop today"}
    monkeypatch.setattr(scenarios, "unavailable_variants", lambda: missing)
    reported: list[tuple[str, int, int]] = []

    rows = run_scenarios(
        ("tree",), (1,), requests=5, rounds=1, progress=lambda *a: reported.append(a)
    )

    variants = by_variant(rows, "tree", 1)
    for variant, reason in missing.items():
        row = variants[variant]
        assert (row["requests_per_s"], row["ratio"], row["rounds"]) == (None, None, [])
        assert row["unavailable"] == reason
    assert variants["corral-blocking"]["ratio"] is not None
    assert len(reported) == len(VARIANTS) - len(missing)
    assert not any("async" in label for label, _, _ in reported)


def test_without_batching_the_harness_runs_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    # As before the scheduler landed: Host(root) alone, no batching= keyword.
    monkeypatch.setattr(scenarios, "_takes_batching", lambda host_type: False)

    rows = run_scenarios(("tree",), (2,), requests=6, rounds=1)

    variants = by_variant(rows, "tree", 2)
    for variant in ("corral-blocking-batched", "corral-async-batched"):
        assert variants[variant]["requests_per_s"] is None
        assert variants[variant]["unavailable"] == "corral.Host takes no batching= argument yet"
    for variant in ("corral-blocking", "corral-async"):
        assert variants[variant]["requests_per_s"] > 0


# -- failures while measuring ---------------------------------------------------------------


def test_a_failing_caller_fails_the_run_once_every_thread_has_ended() -> None:
    inputs = scenarios._inputs(4, 3, 9)

    def call(index: int, x: np.ndarray) -> np.ndarray:
        if index == 1:
            raise OSError("caller 1 broke")
        return np.zeros((1, 1), np.float32)

    with pytest.raises(OSError, match="caller 1 broke"):
        scenarios._time_threads(call, inputs)
    # The autouse fixture checks that no caller thread outlives the test.


def wrong_answer(index: int, x: np.ndarray) -> np.ndarray:
    return np.zeros((1, 2), np.float32)


async def wrong_answer_async(index: int, x: np.ndarray) -> np.ndarray:
    return wrong_answer(index, x)


def test_a_wrong_answer_fails_a_threaded_run() -> None:
    inputs = scenarios._inputs(4, 2, 4)

    with pytest.raises(RuntimeError, match=r"shape \(1, 2\), not \(1, 1\)"):
        scenarios._time_threads(wrong_answer, inputs)


def test_a_wrong_answer_fails_an_asyncio_run() -> None:
    inputs = scenarios._inputs(4, 2, 4)

    with pytest.raises(RuntimeError, match=r"shape \(1, 2\), not \(1, 1\)"):
        asyncio.run(scenarios._time_tasks(wrong_answer_async, inputs))


def test_inputs_split_requests_evenly_and_repeat() -> None:
    inputs = scenarios._inputs(8, 3, 10)

    assert [len(share) for share in inputs] == [4, 3, 3]
    assert all(x.shape == (1, 8) and x.dtype == np.float32 for share in inputs for x in share)
    again = scenarios._inputs(8, 3, 10)
    assert all(
        np.array_equal(a, b)
        for one, two in zip(inputs, again, strict=True)
        for a, b in zip(one, two, strict=True)
    )


# -- bad arguments --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"models": ("tree", "oak")}, "unknown model 'oak'"),
        ({"models": ()}, "no models"),
        ({"concurrencies": ()}, "positive integers"),
        ({"concurrencies": (1, 0)}, "positive integers"),
        ({"concurrencies": (1, 8), "requests": 7}, "at least the largest concurrency"),
        ({"rounds": 0}, "rounds must be at least 1"),
    ],
)
def test_bad_arguments_are_refused_before_measuring(kwargs: Any, message: str) -> None:
    reported: list[object] = []

    with pytest.raises(ValueError, match=message):
        run_scenarios(
            **{"models": ("tree",), "concurrencies": (1,), **kwargs}, progress=reported.append
        )

    assert reported == []


# -- the plot -------------------------------------------------------------------------------


def fake_row(model: str, concurrency: int, variant: str, rate: float | None) -> ScenarioRow:
    return ScenarioRow(
        model=model,
        concurrency=concurrency,
        variant=variant,
        requests=100,
        requests_per_s=rate,
        rounds=[] if rate is None else [rate],
        baseline=1000.0,
        ratio=None if rate is None or variant in BASELINES else rate / 1000.0,
        unavailable="not yet" if rate is None else None,
    )


def test_plot_draws_a_png_and_skips_variants_that_did_not_run(tmp_path: Path) -> None:
    rows = [
        fake_row(model, concurrency, variant, None if variant.endswith("batched") else 500.0)
        for model in ("tree", "mlp")
        for concurrency in (1, 2, 4)
        for variant in VARIANTS
    ]
    path = tmp_path / "scenarios.png"

    plot_scenarios(rows, path)

    assert path.read_bytes().startswith(PNG_MAGIC)


def test_plot_refuses_no_rows(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no rows"):
        plot_scenarios([], tmp_path / "empty.png")


def test_plot_without_matplotlib_says_which_extra_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # None entries in sys.modules make the import machinery treat matplotlib as absent.
    for module in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, module, None)

    with pytest.raises(ImportError, match=r"pip install -e '\.\[dev\]' in corral's clone"):
        plot_scenarios([fake_row("tree", 1, "A-shared", 1.0)], tmp_path / "never.png")


# -- the command line -----------------------------------------------------------------------


@pytest.mark.timeout(150)
def test_command_line_prints_tables_and_writes_json_and_a_png(tmp_path: Path) -> None:
    json_path, png_path = tmp_path / "rows.json", tmp_path / "rows.png"
    argv = ["--models", "tree,mlp", "--concurrency", "2,1"]
    argv += ["--requests", "10", "--rounds", "1", "--json", str(json_path)]
    argv += ["--plot", str(png_path)]

    completed = run_benchmark("scenarios.py", argv, timeout=100)

    assert completed.returncode == 0, completed.stderr
    document = json.loads(json_path.read_text())
    assert set(document) == {"environment", "rows"}
    assert document["environment"]["cpu_count"] >= 1
    rows = document["rows"]
    assert [(r["model"], r["concurrency"], r["variant"]) for r in rows] == [
        (model, concurrency, variant)
        for model in ("tree", "mlp")
        for concurrency in (1, 2)
        for variant in VARIANTS
    ]
    assert all(r["requests_per_s"] > 0 for r in rows if r["variant"] in BASELINES)
    assert png_path.read_bytes().startswith(PNG_MAGIC)
    for expected in ("tree: requests/s", "mlp: requests/s", "callers", "vs best", "async+b"):
        assert expected in completed.stdout
    # Piped, the table is drawn 120 columns wide at most.
    assert max(len(line) for line in completed.stdout.splitlines()) <= 120
    assert f"rows written to {json_path}" in completed.stderr


def test_tables_show_a_dash_and_the_reason_for_variants_that_did_not_run() -> None:
    from rich.console import Console

    rates = {"A-shared": 1000.0, "B-per-thread": 800.0, "corral-blocking": 900.0}
    rows = [
        fake_row(model, concurrency, variant, rates.get(variant))
        for model in ("tree", "mlp")
        for concurrency in (1, 32)
        for variant in VARIANTS
    ]
    environment = {"python": "3.x", "onnxruntime": "1.x", "cpu_count": 2, "runtime_options": "o"}
    console = Console(width=120, record=True)

    tables = scenarios.scenario_tables(rows, environment)
    for table in tables:
        console.print(table)

    text = console.export_text()
    assert [str(table.title).split(":")[0] for table in tables] == ["tree", "mlp"]
    assert "0.90x" in text  # corral-blocking over the better baseline, A's 1,000
    assert "blk+b not measured: not yet." in text
    assert "lowest here 0.90x (blk at concurrency 1)" in text
    assert text.count("async+b >= 1.5x") == 0  # no async+b figure to compare
    assert max(len(line) for line in text.splitlines()) <= 120


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--models", ","], "argument --models: must name at least one model"),
        (["--concurrency", "1,0"], "argument --concurrency: must be a positive integer"),
        (["--requests", "0"], "argument --requests: must be a positive integer"),
        (["--models", "tree,oak"], "argument --models: unknown model 'oak'"),
    ],
)
def test_command_line_refuses_bad_arguments(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)

    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_command_line_plot_without_matplotlib_fails_before_measuring(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)

    with pytest.raises(SystemExit, match=r"--plot: .*pip install -e '\.\[dev\]' in corral's clone"):
        main(["--models", "tree", "--plot", str(tmp_path / "p.png")])

    assert "callers" not in capsys.readouterr().out
