"""Problems at start: the repository check, ``corral check``, ``corral serve`` and ``--strict``.

One broken repository holds a problem of every kind a scan can find; it is checked in
process (the Host, its poll, the CLI) and served once by a real ``corral serve`` for the
module, whose log, index and metrics must report each problem.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper

import corral
from corral._base.problems import Problem, ProblemKind
from corral._host.check import find_problems
from corral.cli import main
from corral.testing import build_linear, build_mlp
from tests.helpers import add_model, reference_run
from tests.processes import ServerProcess, start_server, stop_server

# Above a small linear model's estimate (about 99 KB), below the "big" one's (about 213 KB).
BUDGET = "150000"

# Every kind a scan finds, the model (or entry) it is found in, and a phrase of its message.
SCANNED: dict[ProblemKind, tuple[str | None, str]] = {
    ProblemKind.INVALID_NAME: (None, "'bad name' cannot name a model"),
    ProblemKind.BAD_LAYOUT: ("dup", "keep the folder or the file, not both"),
    ProblemKind.NO_VERSION: ("noversion", "no version in"),
    ProblemKind.NO_MODEL_FILE: ("gap", "has no model.onnx"),
    ProblemKind.BAD_MODEL_FILE: ("junk", "it is not an ONNX model"),
    ProblemKind.BAD_MODEL_TOML: ("typo", "unknown key 'max_batch_sise'"),
    ProblemKind.BAD_CONFIG_PBTXT: ("triton", "platform 'tensorflow_graphdef' is not served"),
    ProblemKind.MISSING_PROVIDER: ("gpu", "'CUDAExecutionProvider' is not in this onnxruntime"),
    ProblemKind.BAD_CUSTOM_OP_LIBRARY: ("ops", "custom op library"),
    ProblemKind.TOO_LARGE: ("big", "more than the whole memory budget (150,000 bytes)"),
}


def build_broken(root: Path) -> Path:
    """A repository with one good model and one problem of each kind in SCANNED."""
    model = build_linear()
    add_model(root, "good", model)
    add_model(root, "bad name", model)
    add_model(root, "dup", model)
    (root / "dup.onnx").write_bytes(model)
    (root / "noversion").mkdir()
    (root / "gap" / "1").mkdir(parents=True)
    add_model(root, "gap", model, version=2)
    (add_model(root, "junk", model)).write_bytes(b"\xff\xff\xff not a model")
    add_model(root, "typo", model, toml="max_batch_sise = 4\n")
    add_model(root, "triton", model)
    (root / "triton" / "config.pbtxt").write_text(
        'name: "triton"\nplatform: "tensorflow_graphdef"\n'
    )
    add_model(root, "gpu", model, toml='providers = ["CUDAExecutionProvider"]\n')
    add_model(root, "ops", model, toml='custom_op_libraries = ["libjunk.so"]\n')
    (root / "ops" / "libjunk.so").write_bytes(b"not a shared library, " * 16)
    add_model(root, "big", build_linear(n_features=128, n_outputs=128))
    (root / ".git").mkdir()  # hidden: not a problem
    return root


@pytest.fixture(scope="module")
def broken(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_broken(tmp_path_factory.mktemp("broken"))


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("good")
    add_model(root, "linear", build_linear())
    (root / "bare.onnx").write_bytes(build_linear(seed=1))
    return root


def assert_every_kind(problems: list[Problem] | tuple[Problem, ...]) -> None:
    by_kind = {problem.kind: problem for problem in problems}
    assert set(by_kind) == set(SCANNED), problems
    for kind, (model, phrase) in SCANNED.items():
        problem = by_kind[kind]
        assert problem.model == model, problem
        assert phrase in problem.message, problem
        assert problem.fix, problem
        assert problem.path, problem
    assert len(problems) == len(SCANNED), problems  # nothing reported twice, "good" clean


# -- the scan, in process --------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_the_scan_finds_each_kind_without_loading(broken: Path):
    with corral.Host(broken, memory_budget=BUDGET) as host:
        assert_every_kind(host.check())
        assert host.stats().loads == 0
        assert host.stats().load_failures == 0
        statuses = {status.name: status for status in host.models()}
    assert statuses["good"].failure is None
    assert "unknown key 'max_batch_sise'" in (statuses["typo"].failure or "")
    assert "fix:" in (statuses["typo"].failure or "")
    assert statuses["gap"].failure is None  # its version 2 loads


@pytest.mark.timeout(60)
def test_model_files_are_read_only_with_a_budget_or_when_asked(broken: Path):
    repository = corral.Repository(broken)
    quick, _ = find_problems(repository, memory_budget=None, pool_size=1)
    kinds = {problem.kind for problem in quick}
    # Libraries are loaded only when files are read, as model files are.
    read_only = {
        ProblemKind.BAD_MODEL_FILE,
        ProblemKind.TOO_LARGE,
        ProblemKind.BAD_CUSTOM_OP_LIBRARY,
    }
    assert kinds == set(SCANNED) - read_only
    read, _ = find_problems(repository, memory_budget=None, pool_size=1, read_model_files=True)
    assert {problem.kind for problem in read} == kinds | {
        ProblemKind.BAD_MODEL_FILE,
        ProblemKind.BAD_CUSTOM_OP_LIBRARY,
    }


@pytest.mark.timeout(60)
def test_an_empty_repository_is_a_problem(tmp_path: Path):
    with corral.Host(tmp_path) as host:
        (problem,) = host.check()
    assert problem.kind is ProblemKind.EMPTY_REPOSITORY
    assert str(tmp_path) in problem.message


@pytest.mark.timeout(60)
def test_each_problem_is_logged_once_and_again_when_it_comes_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    root = tmp_path / "repo"
    root.mkdir()
    add_model(root, "linear", build_linear())
    caplog.set_level(logging.INFO, logger="corral._host.check")

    def logged() -> tuple[list[str], list[str]]:
        """The warnings and the info lines logged since the last call."""
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
        caplog.clear()
        return warnings, infos

    with corral.Host(root) as host:
        assert host.check() == ()
        host.refresh()  # a poll with no problem: nothing logged
        assert logged() == ([], [])
        (root / "linear" / "model.toml").write_text("pinned = 'yes'\n")
        host.refresh()  # the next poll logs the problem that appeared after start
        (line,), _ = logged()
        assert line.startswith("corral: repository problem (bad_model_toml): ")
        assert "model.toml" in line
        assert "pinned" in line
        assert "; fix: " in line
        assert host.problems[0].kind is ProblemKind.BAD_MODEL_TOML
        host.refresh()  # it persists: not logged again
        assert logged() == ([], [])
        (root / "linear" / "model.toml").unlink()
        host.refresh()
        assert host.problems == ()
        warnings, (gone,) = logged()
        assert warnings == []
        assert "(bad_model_toml)" in gone
        assert gone.endswith("is gone")
        (root / "linear" / "model.toml").write_text("pinned = 'yes'\n")
        host.refresh()  # back again: logged again
        assert len(logged()[0]) == 1


@pytest.mark.timeout(60)
def test_polls_do_not_scan_until_a_first_check(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    add_model(tmp_path, "linear", build_linear(), toml="pinned = 'yes'\n")
    caplog.set_level(logging.WARNING, logger="corral._host.check")
    with corral.Host(tmp_path) as host:
        host.refresh()
        assert host.problems == ()
        assert caplog.records == []


# -- corral check ----------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_check_prints_every_problem_with_its_fix_and_exits_1(
    broken: Path, capsys: pytest.CaptureFixture[str]
):
    assert main(["check", str(broken), "--memory-budget", BUDGET]) == 1
    out, err = capsys.readouterr()
    for kind, (_, phrase) in SCANNED.items():
        assert f"{kind.value}: " in out
        assert phrase in out
    assert out.count("  fix: ") == len(SCANNED)
    assert f"{len(SCANNED)} problems" in err


@pytest.mark.timeout(60)
def test_a_bad_budget_is_a_bad_argument(good: Path, capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as exited:
        main(["check", str(good), "--memory-budget", "lots"])
    assert exited.value.code == 2
    assert "--memory-budget" in capsys.readouterr().err


@pytest.mark.timeout(60)
def test_check_json_and_a_failed_load_is_a_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    add_model(tmp_path, "linear", build_linear())
    # A well-formed file of a graph onnxruntime refuses: only a load finds it.
    add_model(tmp_path, "unknown_op", build_unknown_op())
    assert main(["check", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["problems"] == []
    assert main(["check", str(tmp_path), "--load", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    (problem,) = report["problems"]
    assert problem["kind"] == "load_failed"
    assert problem["model"] == "unknown_op"
    assert "NoSuchOp" in problem["message"]
    assert [row["model"] for row in report["loaded"]] == ["linear"]


def build_unknown_op() -> bytes:
    """A valid ONNX file whose one node is of an operator no onnxruntime has."""
    graph = helper.make_graph(
        [helper.make_node("NoSuchOp", ["X"], ["Y"])],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


@pytest.mark.timeout(60)
def test_a_good_repository_passes_and_load_prints_sizes_and_times(
    good: Path, capsys: pytest.CaptureFixture[str]
):
    assert main(["check", str(good)]) == 0
    out, err = capsys.readouterr()
    assert out == ""
    assert "no problems" in err
    assert main(["check", str(good), "--load"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2, lines
    for line, name in zip(lines, ["bare", "linear"], strict=True):
        assert line.startswith(f"loaded {name} version 1: ")
        assert " bytes (estimated), " in line
        assert line.endswith(" s")


# -- corral serve ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(broken: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("log") / "serve.log"
    served = start_server(broken, log, "--memory-budget", BUDGET)
    yield served
    stop_server(served)


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as response:
        body: bytes = response.read()
        return body


@pytest.mark.timeout(90)
def test_serve_logs_each_problem_at_start_before_serving(server: ServerProcess):
    log = server.log.read_text()
    serving = log.index(" serving ")
    for kind, (_, phrase) in SCANNED.items():
        line = next(
            (x for x in log.splitlines() if f"repository problem ({kind.value})" in x), None
        )
        assert line is not None, (kind, log)
        assert "WARNING" in line
        assert phrase in line
        assert "; fix: " in line
        assert log.index(line) < serving
        assert log.count(f"repository problem ({kind.value})") == 1


@pytest.mark.timeout(90)
def test_the_index_shows_problem_models_unavailable_with_the_reason(server: ServerProcess):
    import tritonclient.grpc as grpcclient

    request = urllib.request.Request(f"http://{server.http}/v2/repository/index", method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        rows: list[dict[str, Any]] = json.loads(response.read())
    http = {row["name"]: row for row in rows}
    client = grpcclient.InferenceServerClient(server.grpc)
    try:
        index = client.get_model_repository_index(as_json=True)
    finally:
        client.close()
    grpc = {row["name"]: row for row in index["models"]}
    for kind, (model, phrase) in SCANNED.items():
        if model is None or kind is ProblemKind.NO_MODEL_FILE:
            continue
        for row in (http[model], grpc[model]):
            assert row["state"] == "UNAVAILABLE", row
            assert phrase in row["reason"], row
    # Models with no problem (or only a version folder skipped) are as before: no reason.
    assert http["good"] == {"name": "good", "state": "UNAVAILABLE"}
    assert http["gap"] == {"name": "gap", "state": "UNAVAILABLE"}
    assert "bad name" not in http


@pytest.mark.timeout(90)
def test_the_problems_gauge_counts_each_kind(server: ServerProcess):
    text = get(f"http://{server.http}/metrics").decode()
    for kind in ProblemKind:
        expected = 1 if kind in SCANNED else 0
        assert f'corral_repository_problems{{kind="{kind.value}"}} {expected}.0' in text, kind


@pytest.mark.timeout(90)
def test_strict_refuses_to_start_with_every_problem_listed(broken: Path):
    command = [sys.executable, "-m", "corral.cli", "serve", "--http-port", "0"]
    command += ["--grpc-port", "-1", "--memory-budget", BUDGET, "--strict"]
    refused = subprocess.run(
        [*command, str(broken)], capture_output=True, text=True, timeout=60, check=False
    )
    assert refused.returncode == 2, refused.stderr
    for kind in SCANNED:
        assert f"repository problem ({kind.value})" in refused.stderr
    assert f"refusing to start: {len(SCANNED)} problem(s)" in refused.stderr
    assert " serving " not in refused.stderr  # stopped before binding a port
    quiet = subprocess.run(
        [*command, "--log-level", "error", str(broken)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert quiet.returncode == 2
    for kind in SCANNED:
        assert f"\n  {kind.value}: " in quiet.stderr  # listed in the error itself


@pytest.mark.timeout(60)
def test_checks_at_once_log_each_problem_once(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    add_model(tmp_path, "linear", build_linear(), toml="pinned = 'yes'\n")
    caplog.set_level(logging.WARNING, logger="corral._host.check")
    barrier = threading.Barrier(8)
    found: list[tuple[Problem, ...]] = []

    def check(host: corral.Host) -> None:
        barrier.wait(timeout=30)
        found.append(host.check())

    with corral.Host(tmp_path) as host:
        threads = [threading.Thread(target=check, args=(host,)) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
    assert len(found) == 8
    assert set(found) == {host.problems}
    assert len(caplog.records) == 1


# -- config.pbtxt against the model file, without loading -----------------------------------


def build_recogniser() -> bytes:
    """y = x + x, x and y float[N, 3, 48, W]: a recogniser's shapes, its width dynamic."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 48, "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3, 48, "W"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


# Each config.pbtxt body, what check says of it, and the fix it gives.
DECLARATIONS = {
    "narrowed": (
        "max_batch_size: 8\ninput [{ name: 'x' data_type: TYPE_FP32 dims: [3, 48, 192] }]",
        None,
        None,
    ),
    "renamed": (
        "max_batch_size: 8\ninput [{ name: 'image' data_type: TYPE_FP32 dims: [3, 48, -1] }]",
        "config.pbtxt's input 'image' is not one of the model's inputs: 'x'",
        "name one of the model's inputs, or remove the declaration",
    ),
    "retyped": (
        "max_batch_size: 8\ninput [{ name: 'x' data_type: TYPE_FP16 dims: [3, 48, -1] }]",
        "config.pbtxt's input 'x' is declared TYPE_FP16, but the model's is TYPE_FP32 "
        "(float32[N, 3, 48, W])",
        "declare data_type: TYPE_FP32",
    ),
    "contradicted": (
        "max_batch_size: 8\noutput [{ name: 'y' data_type: TYPE_FP32 dims: [3, 32, 192] }]",
        "config.pbtxt's output 'y' has dims [3, 32, 192] (after the batch dimension), but the "
        "model's dimension 2 is 48 (float32[N, 3, 48, W])",
        "declare dims: [3, 48, -1] (the model's), or sizes that fix only its -1s",
    ),
    "unbatched": (
        "input [{ name: 'x' data_type: TYPE_FP32 dims: [3, 48, 192] }]",
        "config.pbtxt's input 'x' has dims [3, 48, 192]: 3 dimensions in all, but the model's "
        "has 4 (float32[N, 3, 48, W])",
        "declare dims: [-1, 3, 48, -1] (the model's), or sizes that fix only its -1s; or set "
        "max_batch_size if the model's first dimension is the batch's",
    ),
}


@pytest.mark.timeout(60)
def test_check_holds_config_pbtxt_against_the_model_file_without_loading(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    for name, (body, _, _) in DECLARATIONS.items():
        add_model(tmp_path, name, build_recogniser())
        (tmp_path / name / "config.pbtxt").write_text(body.replace("'", '"') + "\n")
    assert main(["check", str(tmp_path), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    found: dict[str, list[dict[str, str]]] = {}
    for problem in report["problems"]:
        found.setdefault(problem["model"], []).append(problem)
    wanted = {name: case for name, case in DECLARATIONS.items() if case[1] is not None}
    assert set(found) == set(wanted), report["problems"]
    for name, (_, message, fix) in wanted.items():
        problem = found[name][0]
        assert problem["kind"] == "bad_config_pbtxt"
        assert problem["message"] == f"model {name!r} version 1: {message}"
        assert problem["fix"] == fix
        assert problem["path"] == str(tmp_path / name / "config.pbtxt")
    # Every mismatch is reported, not only the first: the renamed input leaves 'x' undeclared.
    assert [len(problems) for problems in found.values()] == [
        2 if name == "renamed" else 1 for name in found
    ]
    assert found["renamed"][1]["message"].endswith("declares inputs but not the model's 'x'")
    with corral.Host(tmp_path) as host:
        assert host.stats().loads == 0  # none loaded by the check
        # What check accepts loads, what it refuses fails the load with the same words.
        host.load("narrowed")
        for name, (_, message, _) in wanted.items():
            with pytest.raises(corral.ModelConfigError) as caught:
                host.load(name)
            assert message in str(caught.value)


@pytest.mark.timeout(90)
def test_strict_refuses_a_file_that_is_not_onnx_and_a_contradicting_config_without_a_budget(
    tmp_path: Path,
):
    add_model(tmp_path, "good", build_linear())
    (add_model(tmp_path, "junk", build_linear())).write_bytes(b"\xff\xff\xff not a model")
    add_model(tmp_path, "contradicted", build_recogniser())
    (tmp_path / "contradicted" / "config.pbtxt").write_text(
        DECLARATIONS["contradicted"][0].replace("'", '"') + "\n"
    )
    command = [sys.executable, "-m", "corral.cli", "serve", "--http-port", "0"]
    refused = subprocess.run(
        [*command, "--grpc-port", "-1", "--strict", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert refused.returncode == 2, refused.stderr
    assert "repository problem (bad_model_file): model 'junk' version 1" in refused.stderr
    assert "repository problem (bad_config_pbtxt): model 'contradicted' version 1" in (
        refused.stderr
    )
    assert "refusing to start: 2 problem(s)" in refused.stderr
    assert " serving " not in refused.stderr


@pytest.mark.timeout(60)
def test_a_check_that_reads_model_files_keeps_reading_them_at_each_poll(tmp_path: Path):
    add_model(tmp_path, "linear", build_linear())
    with corral.Host(tmp_path) as host:
        assert host.check(read_model_files=True) == ()
        (tmp_path / "linear" / "1" / "model.onnx").write_bytes(b"\xff not a model")
        host.refresh()
        assert [p.kind for p in host.problems] == [ProblemKind.BAD_MODEL_FILE]
        assert host.check(read_model_files=False) == ()
        host.refresh()
        assert host.problems == ()


# -- the start's check lends its reads to the loads ------------------------------------------


def _count_reads(monkeypatch: pytest.MonkeyPatch) -> tuple[Counter[str], list[Path]]:
    """Count each model's entry reads and every walk of a model file, from here on."""
    from corral._models import repository as repository_module
    from corral._onnx import modelfile, value_dependence

    entries: Counter[str] = Counter()
    walks: list[Path] = []
    entry = repository_module.Repository.entry

    def counted_entry(self: Any, name: str) -> Any:
        entries[name] += 1
        return entry(self, name)

    def counted_walk(module: Any) -> Any:
        walk = module.walk_model_file

        def walked(model: Path, *args: Any) -> Any:
            walks.append(model)
            return walk(model, *args)

        return walked

    monkeypatch.setattr(repository_module.Repository, "entry", counted_entry)
    monkeypatch.setattr(modelfile, "walk_model_file", counted_walk(modelfile))
    monkeypatch.setattr(value_dependence, "walk_model_file", counted_walk(value_dependence))
    return entries, walks


def test_a_preload_after_a_kept_check_reads_each_model_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Issue 49: a server checks, then loads every model; each entry and file is read once."""
    add_model(tmp_path, "linear", build_linear(seed=1))
    add_model(tmp_path, "mlp", build_mlp(seed=2))
    add_model(tmp_path, "declared", build_linear(seed=3))
    (tmp_path / "declared" / "config.pbtxt").write_text(
        'input [ { name: "X", data_type: TYPE_FP32, dims: [ -1, 4 ] } ]\n'
    )
    entries, walks = _count_reads(monkeypatch)
    with corral.Host(tmp_path, memory_budget="1GiB") as host:
        assert host.check(keep_entries=True) == ()
        assert entries == {"linear": 1, "mlp": 1, "declared": 1}
        assert len(walks) == 3
        assert host.preload() == {}
        assert entries == {"linear": 1, "mlp": 1, "declared": 1}  # the check's, taken
        assert len(walks) == 3  # the check's readings, taken
        assert host.stats().loaded_models == 3
        # Taken once: the next preload reads each entry again, as a load does.
        assert host.preload() == {}
        assert entries == {"linear": 2, "mlp": 2, "declared": 2}


def test_a_check_that_keeps_nothing_leaves_the_preload_to_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    add_model(tmp_path, "linear", build_linear(seed=1))
    entries, _ = _count_reads(monkeypatch)
    with corral.Host(tmp_path) as host:
        host.check()
        assert host.preload() == {}
        assert entries == {"linear": 2}


def test_a_model_changed_after_the_check_loads_the_file_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The check's entry and reading name the old file: the load must not serve it as such."""
    model = add_model(tmp_path, "m", build_mlp(seed=4))
    _, walks = _count_reads(monkeypatch)
    with corral.Host(tmp_path, memory_budget="1GiB") as host:
        host.check(keep_entries=True)
        newer = build_linear(seed=5)  # smaller: it fits what the old estimate reserved
        model.write_bytes(newer)
        assert host.preload() == {}
        features = np.arange(8, dtype=np.float32).reshape(2, 4)
        answer = host.infer("m", {"X": features})
        expected = reference_run(newer, {"X": features})[0]
        np.testing.assert_allclose(next(iter(answer.values())), expected, rtol=1e-6)
        # The changed file was read anew: the check's reading named the old one.
        assert len(walks) >= 2
