"""The ``corral`` command line and ``corral demo``.

Whatever runs onnxruntime's default sessions, or the command line as a whole, runs in a
subprocess: onnxruntime's global pools, once corral sets them in this process, make default
sessions fail. Sessions made in this process use the default Runtime.
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
import corral.demo
from corral.cli import main
from corral.cli.demo import ratio
from corral.demo import WorkerFailed, build_models, run_worker
from corral.testing import build_model
from tests.helpers import ROOT, add_model

# onnxruntime's worker takes 50-60 ms to free each default session: a few models suffice.
N_MODELS = 10
# Leaves the subprocess's own hard timeout room to report before pytest-timeout fires.
WORKER_TIMEOUT_S = 100.0
# Each worker idles this long while its idle CPU is measured: these tests check that the figure
# is reported, not its value, and the demo's 2 s would add 2 s per worker to make test.
IDLE_WINDOW_S = 0.2


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("models")
    build_models(folder, N_MODELS)
    return folder


# -- build_models ---------------------------------------------------------------------------


def test_build_models_writes_count_loadable_models_in_turn(tmp_path: Path) -> None:
    reported: list[int] = []

    paths = build_models(tmp_path / "new", 7, progress=reported.append)

    assert [path.name for path in paths] == [f"model-{n:05d}.onnx" for n in range(1, 8)]
    assert sorted((tmp_path / "new").iterdir()) == paths
    assert reported == list(range(1, 8))
    kinds = [onnx.load(path).graph.name for path in paths]
    assert kinds == ["tree", "linear", "mlp", "tree", "linear", "mlp", "tree"]
    x = np.ones((1, 4), np.float32)
    for path in paths:
        with corral.Session(path) as session:
            assert session.run({"X": x})["Y"].shape == (1, 1)


def test_build_models_is_deterministic(tmp_path: Path) -> None:
    first = build_models(tmp_path / "a", 3)
    second = build_models(tmp_path / "b", 3)

    assert [p.read_bytes() for p in first] == [p.read_bytes() for p in second]


def test_build_models_refuses_no_models(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        build_models(tmp_path, 0)


# -- the demo worker ------------------------------------------------------------------------


@pytest.mark.timeout(150)
@pytest.mark.parametrize("engine", ["corral", "onnxruntime"])
def test_worker_prints_one_line_of_sane_figures(models_dir: Path, engine: str) -> None:
    command = [
        sys.executable,
        "-m",
        "corral.demo",
        "worker",
        "--engine",
        engine,
        "--models",
        str(models_dir),
        "--threads",
        "2",
        "--requests",
        "300",
        "--seed",
        "3",
        "--idle-window-s",
        str(IDLE_WINDOW_S),
    ]

    completed = subprocess.run(
        command, capture_output=True, text=True, timeout=WORKER_TIMEOUT_S, check=False
    )

    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.splitlines()
    assert len(lines) == 1, completed.stdout
    result = json.loads(lines[0])
    assert result["engine"] == engine
    assert result["sessions"] == N_MODELS
    assert result["requests"] == 300
    assert result["throughput"] > 0
    assert result["run_seconds"] > 0
    assert result["throughput"] == pytest.approx(300 / result["run_seconds"])
    assert result["load_seconds"] > 0
    assert result["threads_before"] >= 1
    assert result["rss_before"] > 0
    assert result["rss_after_load"] > result["rss_before"]
    assert result["rss_per_session"] == pytest.approx(
        (result["rss_after_load"] - result["rss_before"]) / N_MODELS
    )
    assert result["idle_cpu_percent"] >= 0
    assert result["close_seconds"] >= 0
    if engine == "corral":
        # The point of corral: loading models does not add threads.
        assert result["threads_after_load"] - result["threads_before"] <= 2
        assert result["threads_after_run"] - result["threads_before"] <= 2
    elif psutil.cpu_count(logical=False) and psutil.cpu_count(logical=False) >= 2:
        # onnxruntime's default gives each session its own intra-op pool.
        assert result["threads_after_load"] - result["threads_before"] >= N_MODELS


@pytest.mark.timeout(150)
def test_run_worker_shares_an_uneven_workload_exactly(models_dir: Path) -> None:
    result = run_worker(
        "corral", models_dir, 3, 100, timeout=WORKER_TIMEOUT_S, idle_window_s=IDLE_WINDOW_S
    )

    assert result.requests == 100
    assert result.threads == 3
    assert result.sessions == N_MODELS


def test_run_worker_failure_carries_the_workers_stderr(tmp_path: Path) -> None:
    with pytest.raises(WorkerFailed, match=r"exited with status 1(.|\n)*no \.onnx files"):
        run_worker("corral", tmp_path, 2, 10, timeout=WORKER_TIMEOUT_S)


def test_run_worker_kills_a_worker_past_its_timeout(models_dir: Path) -> None:
    # Far shorter than starting an interpreter and importing numpy takes.
    with pytest.raises(WorkerFailed, match=r"did not finish within 0\.001s"):
        run_worker("corral", models_dir, 2, 10, timeout=0.001)


# -- corral demo ----------------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_demo_json_reports_both_engines_and_keeps_models(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kept = tmp_path / "kept"
    argv = ["demo", "--models", "10", "--threads", "2", "--requests", "300", "--json"]
    argv += ["--idle-window-s", str(IDLE_WINDOW_S)]

    code = main([*argv, "--keep", str(kept)])

    captured = capsys.readouterr()
    assert code == 0, captured.err
    result = json.loads(captured.out)
    assert (result["models"], result["threads"], result["requests"]) == (10, 2, 300)
    for engine in ("corral", "onnxruntime"):
        assert result[engine]["engine"] == engine
        assert result[engine]["sessions"] == 10
        assert result[engine]["requests"] == 300
        assert result[engine]["throughput"] > 0
    assert len(list(kept.glob("model-*.onnx"))) == 10
    assert "building 10 models" in captured.err


def test_demo_reports_a_failed_worker_with_its_stderr(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def failing_demo(*args: object, **kwargs: object) -> None:
        raise WorkerFailed("the corral worker exited with status 1; stderr:\nMemoryError")

    # The command imports run_demo when it runs, so it finds this one.
    monkeypatch.setattr(corral.demo, "run_demo", failing_demo)

    code = main(["demo", "--models", "1"])

    assert code == 1
    err = capsys.readouterr().err
    assert "corral demo: error: the corral worker exited with status 1" in err
    assert "MemoryError" in err
    # A failure of the demo's own processes, not of the library: outside corral's tree.
    assert not issubclass(WorkerFailed, corral.CorralError)


def test_demo_refuses_a_keep_folder_that_already_holds_models(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "other.onnx").write_bytes(b"")

    code = main(["demo", "--models", "1", "--keep", str(tmp_path)])

    assert code == 1
    assert "already holds .onnx files" in capsys.readouterr().err
    assert [path.name for path in tmp_path.iterdir()] == ["other.onnx"]


@pytest.mark.timeout(300)
def test_demo_prints_the_table(tmp_path: Path) -> None:
    completed = subprocess.run(
        [
            *(
                sys.executable,
                "-m",
                "corral.cli",
                "demo",
                "--models",
                "6",
                "--requests",
                "60",
            ),
            *("--idle-window-s", str(IDLE_WINDOW_S)),
        ],
        capture_output=True,
        text=True,
        timeout=250,
        check=False,
        env={**os.environ, "COLUMNS": "120"},
    )

    assert completed.returncode == 0, completed.stderr
    for row in (
        "threads (after load)",
        "RSS per session (KiB)",
        "load time (s)",
        "throughput (runs/s)",
        "idle CPU (%)",
    ):
        assert row in completed.stdout
    assert "onnxruntime defaults" in completed.stdout


# -- arguments ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["demo", "--models", "0"], "argument --models: must be a positive integer, got 0"),
        (["demo", "--threads", "-2"], "argument --threads: must be a positive integer, got -2"),
        (["demo", "--requests", "many"], "argument --requests: must be a positive integer"),
        (["demo", "--idle-window-s", "0"], "argument --idle-window-s: must be a positive number"),
        # The benchmarks are scripts in benchmarks/, no longer commands.
        (["bench", "create"], "argument COMMAND: invalid choice: 'bench'"),
        ([], "required: COMMAND"),
        (["models", ".", "--memory-budget", "2G"], "argument --memory-budget: size '2G' is amb"),
        (["models", ".", "--memory-budget", "2x"], "argument --memory-budget: size '2x' is not"),
    ],
)
def test_bad_arguments_exit_non_zero_with_a_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)

    assert exited.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["demo", "--models", "1"],
        ["status", "http://127.0.0.1:9"],
        ["models", "{repo}"],
        ["check", "{repo}", "--load"],
    ],
    ids=["demo", "status", "models", "check --load"],
)
def test_missing_rich_exits_2_naming_the_extra(
    argv: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A None entry in sys.modules makes the import machinery treat rich as absent.
    monkeypatch.setitem(sys.modules, "rich", None)
    add_model(tmp_path, "linear", build_model("mlp", seed=1))

    with pytest.raises(SystemExit) as exited:
        main([arg.format(repo=tmp_path) for arg in argv])

    # 2, as a usage error: never 1, check's and models' "problems found".
    assert exited.value.code == 2
    command = " ".join(["corral", *argv[:1], *(["--load"] if "--load" in argv else [])])
    assert f"{command} needs rich (which the server and cli extras bring): " in (
        capsys.readouterr().err
    )


def test_the_server_extra_brings_what_status_and_check_load_draw_with() -> None:
    # The README and the image install corral[server,grpc]: the operator's commands beside
    # the server must work there.
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert any(requirement.startswith("rich>=") for requirement in extras["server"])


def test_models_preloads_and_lists_a_repository(tmp_path: Path) -> None:
    for name, seed in (("a", 1), ("b", 2)):
        add_model(tmp_path, name, build_model("mlp", seed=seed))
    add_model(tmp_path, "broken", b"junk")
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "corral.cli",
            "models",
            str(tmp_path),
            "--preload",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    # One model failed to load: the command says so and exits 1, the others are listed.
    assert completed.returncode == 1, completed.stderr
    statuses = {s["name"]: s for s in json.loads(completed.stdout)}
    assert statuses["a"]["state"] == statuses["b"]["state"] == "ready"
    assert statuses["broken"]["state"] == "failed"
    assert "corral models: broken:" in completed.stderr


def test_models_without_preload_loads_nothing(tmp_path: Path) -> None:
    (tmp_path / "a.onnx").write_bytes(build_model("tree", seed=1))
    completed = subprocess.run(
        [sys.executable, "-m", "corral.cli", "models", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr
    assert "unloaded" in completed.stdout
    assert "0 versions loaded" in completed.stdout


@pytest.mark.parametrize(
    ("absent", "argv", "message"),
    [
        # Without the server extra, even its flags cannot be parsed: the install is named.
        (
            ["pydantic_settings", "corral.server.settings"],
            ["serve", ".", "--http-port", "1"],
            "corral serve needs the server extra: pip install 'orjson>=3.10' ",
        ),
        (["grpc"], ["serve", "."], "corral serve needs the grpc extra: pip install 'grpcio>="),
        (
            ["ray", "corral.ray._config"],
            ["ray-serve", ".", "--num-replicas", "2"],
            "corral ray-serve needs the ray and server extras: pip install 'ray[serve]>=2.30' ",
        ),
    ],
)
def test_a_missing_extra_says_which_to_install_whatever_the_arguments(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    absent: list[str],
    argv: list[str],
    message: str,
) -> None:
    for module in absent:
        monkeypatch.setitem(sys.modules, module, None)  # the import machinery: absent

    with pytest.raises(SystemExit) as exited:
        main(argv)

    # 2, as a usage error (argparse's): 1 is what serve answers for a model that failed.
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(message), err
    assert "corral[" not in err  # corral is not on the package index: its extras' packages are


@pytest.mark.parametrize(
    ("numerator", "denominator", "shown"),
    [(1, 0, "-"), (0, 5, "0.00x"), (250, 10, "25x"), (12_000, 1, "12,000x"), (3, 1003, "0.003x")],
)
def test_ratio_keeps_two_significant_digits_below_a_tenth(
    numerator: float, denominator: float, shown: str
) -> None:
    assert ratio(numerator, denominator) == shown


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_prints_corrals_and_what_it_runs_on_then_exits_0(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import tomllib

    import onnxruntime

    pyproject = ROOT / "pyproject.toml"
    version = tomllib.loads(pyproject.read_text())["project"]["version"]

    with pytest.raises(SystemExit) as exited:
        main([flag])

    out, err = capsys.readouterr()
    assert exited.value.code == 0
    assert err == ""
    assert out.startswith(f"corral {version} (onnxruntime {onnxruntime.__version__}, ")
    assert f"numpy {np.__version__}" in out
    assert out.count("\n") == 1
    # The version the server reports (GET /v2) is the same one.
    assert corral.__version__ == version


@pytest.mark.timeout(60)
def test_version_from_a_fresh_process_goes_to_stdout() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "corral.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )

    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.startswith(f"corral {corral.__version__} (onnxruntime ")


@pytest.mark.parametrize("command", ["serve", "check"])
def test_serve_and_check_given_one_models_folder_say_so_and_name_its_parent(
    tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
):
    add_model(tmp_path / "models", "magika", build_model("mlp"))
    argv = [command, str(tmp_path / "models" / "magika")]
    if command == "serve":
        argv += ["--http-port", "0", "--grpc-port", "0"]
    code = main(argv)
    err = capsys.readouterr().err
    assert code != 0
    assert "looks like one model's folder, not a repository of models" in err
    assert str(tmp_path / "models") in err
