"""Python models in a worker process of their own (``corral_isolation: process``).

A crash in an isolated model's code costs only that model: its request in flight fails,
typed and naming it, the next request starts a new child, and the other models of the Host
(ONNX, and a Python model in the server's process) see no failure meanwhile.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import corral
from corral import InferenceError, ModelConfigError
from corral.testing import build_mlp
from tests.helpers import ROOT, add_model, wait_until

pytestmark = pytest.mark.timeout(60)

EXAMPLES = ROOT / "tests" / "testdata" / "triton_python"
ISOLATED = '\nparameters { key: "corral_isolation" value: { string_value: "process" } }\n'
A = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
B = np.array([0.5, -1.0, 2.0, 8.0], np.float32)
X = np.ones((3, 4), np.float32)

#: A model that answers its process id, and dies as its input asks: 0 answers, 1 exits
#: at once (os._exit), 2 dies of SIGSEGV, 3 answers the sum of add_sub's OUTPUT0 for ones (BLS),
#: 4 calls a model the Host does not have (BLS).
FRAGILE_CONFIG = (
    """
name: "fragile"
backend: "python"
input [ { name: "HOW" data_type: TYPE_INT64 dims: [ 1 ] } ]
output [ { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] } ]
"""
    + ISOLATED
)
FRAGILE = """
import ctypes
import os

import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        how = int(pb_utils.get_input_tensor_by_name(requests[0], "HOW").as_numpy()[0])
        if how == 1:
            os._exit(7)
        if how == 2:
            ctypes.string_at(0)
        pid = np.array([os.getpid()], np.int64)
        pb_utils.Logger.log_info(f"fragile answers {how}")
        if how in (3, 4):
            a = np.ones(4, np.float32)
            answer = pb_utils.InferenceRequest(
                model_name="add_sub" if how == 3 else "nope",
                requested_output_names=["OUTPUT0"],
                inputs=[pb_utils.Tensor("INPUT0", a), pb_utils.Tensor("INPUT1", a)],
            ).exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            total = pb_utils.get_output_tensor_by_name(answer, "OUTPUT0").as_numpy()
            pid = np.array([int(total.sum())], np.int64)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("PID", pid)])]
"""


def _how(value: int) -> dict[str, np.ndarray]:
    return {"HOW": np.array([value], np.int64)}


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    shutil.copytree(EXAMPLES / "add_sub", root / "add_sub")
    add_model(root, "mlp", build_mlp(seed=3))
    (root / "fragile" / "1").mkdir(parents=True)
    (root / "fragile" / "1" / "model.py").write_text(FRAGILE)
    (root / "fragile" / "config.pbtxt").write_text(FRAGILE_CONFIG)
    return root


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_an_isolated_add_sub_answers_as_in_process_and_finalizes_in_its_child(
    repository: Path, capfd: pytest.CaptureFixture[str]
):
    config = repository / "add_sub" / "config.pbtxt"
    config.write_text(config.read_text() + ISOLATED)
    with corral.Host(repository) as host:
        out = host.infer("add_sub", {"INPUT0": A, "INPUT1": B})
        np.testing.assert_array_equal(out["OUTPUT0"], A + B)
        np.testing.assert_array_equal(out["OUTPUT1"], A - B)
        with pytest.raises(corral.InvalidInput, match="INPUT0"):
            host.infer("add_sub", {"INPUT0": np.ones(5, np.float32), "INPUT1": B})
        assert "Cleaning up..." not in capfd.readouterr().err
    # The child's print goes to the server's standard error, never into its frames.
    assert "Cleaning up..." in capfd.readouterr().err


def test_the_child_runs_apart_and_an_unload_reaps_it(
    repository: Path, capfd: pytest.CaptureFixture[str]
):
    with corral.Host(repository) as host:
        pid = int(host.infer("fragile", _how(0))["PID"][0])
        assert pid != os.getpid()
        assert _alive(pid)
        # Its log records reach the server's standard error, marked with its pid (written
        # and flushed before its answer was sent).
        err = capfd.readouterr().err
        assert f"[worker {pid}] corral.python_model: fragile answers 0" in err
        host.unload("fragile", timeout=10)
        assert not _alive(pid)


def test_two_instances_answer_concurrent_requests_each_in_its_own_child(repository: Path):
    config = repository / "fragile" / "config.pbtxt"
    config.write_text(config.read_text() + "instance_group [ { count: 2 kind: KIND_CPU } ]\n")
    with corral.Host(repository) as host:
        host.load("fragile", timeout=30)
        futures = [host.submit("fragile", _how(0)) for _ in range(40)]
        pids = {int(future.result(timeout=30)["PID"][0]) for future in futures}
    assert os.getpid() not in pids
    assert 1 <= len(pids) <= 2


@pytest.mark.parametrize(("how", "exit_text"), [(1, "exited with code 7"), (2, "SIGSEGV")])
def test_a_crash_costs_only_the_crashed_model(repository: Path, how: int, exit_text: str):
    failures: list[BaseException] = []
    answered = {"mlp": 0, "add_sub": 0}
    stop = threading.Event()

    def hammer(name: str, feed: dict[str, np.ndarray]) -> None:
        while not stop.is_set():
            try:
                host.infer(name, feed, timeout=10)
                answered[name] += 1
            except BaseException as exc:  # counted: the test asserts there are none
                failures.append(exc)

    with corral.Host(repository) as host:
        first = int(host.infer("fragile", _how(0))["PID"][0])
        host.infer("mlp", {"X": X})
        host.infer("add_sub", {"INPUT0": A, "INPUT1": B})
        threads = [
            threading.Thread(target=hammer, args=("mlp", {"X": X})),
            threading.Thread(target=hammer, args=("add_sub", {"INPUT0": A, "INPUT1": B})),
        ]
        for thread in threads:
            thread.start()
        try:
            with pytest.raises(InferenceError, match=f"'fragile:1'.*{exit_text}"):
                host.infer("fragile", _how(how), timeout=20)
            # Loaded again (a new child) on the next request.
            again = int(host.infer("fragile", _how(0), timeout=20)["PID"][0])
            assert again != first
            assert not _alive(first)
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=20)
        assert failures == []
        assert answered["mlp"] > 0
        assert answered["add_sub"] > 0


def test_bls_from_an_isolated_model_is_forwarded_to_the_host(repository: Path):
    with corral.Host(repository) as host:
        assert host.infer("fragile", _how(3))["PID"][0] == 8
        # The call counts as add_sub's request, as an in-process model's does.
        assert host.request_stats()[("add_sub", 1)].success_count == 1
        # A failed call is the response's error, worded as in-process: the model raises it.
        with pytest.raises(InferenceError, match=r"ModelNotFound: .*'nope'"):
            host.infer("fragile", _how(4))
        # The child still answers after it.
        assert host.infer("fragile", _how(3))["PID"][0] == 8


ODD_CONFIG = (
    """
name: "odd"
backend: "python"
input [ { name: "X" data_type: TYPE_INT64 dims: [ 1 ] } ]
output [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
"""
    + ISOLATED
)
ODD = """
import numpy as np
import triton_python_backend_utils as pb_utils

class Odd:
    pass

class TritonPythonModel:
    def execute(self, requests):
        x = int(pb_utils.get_input_tensor_by_name(requests[0], "X").as_numpy()[0])
        text = np.array([Odd() if x else b"plain"], dtype=object)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("TEXT", text)])]
"""


def test_an_answer_holding_an_object_is_not_unpickled_by_the_server(repository: Path):
    (repository / "odd" / "1").mkdir(parents=True)
    (repository / "odd" / "1" / "model.py").write_text(ODD)
    (repository / "odd" / "config.pbtxt").write_text(ODD_CONFIG)
    with corral.Host(repository) as host:
        with pytest.raises(InferenceError, match=r"'odd:1'.*may not hold .*\.Odd"):
            host.infer("odd", {"X": np.array([1], np.int64)})
        # The same child answers the next request.
        assert host.infer("odd", {"X": np.array([0], np.int64)})["TEXT"][0] == b"plain"


def test_isolation_asked_of_an_onnx_model_is_named_without_effect(
    repository: Path, caplog: pytest.LogCaptureFixture
):
    (repository / "mlp" / "config.pbtxt").write_text('platform: "onnxruntime_onnx"' + ISOLATED)
    with corral.Host(repository) as host:
        assert host.infer("mlp", {"X": X})["Y"].shape == (3, 1)
    named = [r.getMessage() for r in caplog.records if "without effect" in r.getMessage()]
    assert any("corral_isolation" in message for message in named)


def test_an_unknown_isolation_is_refused_naming_the_parameter(repository: Path):
    config = repository / "fragile" / "config.pbtxt"
    config.write_text(config.read_text().replace('"process"', '"thread"'))
    with (
        corral.Host(repository) as host,
        pytest.raises(ModelConfigError, match=r"corral_isolation.*'thread'"),
    ):
        host.infer("fragile", _how(0))


def test_a_child_stuck_in_initialize_is_killed_at_the_load_timeout(
    repository: Path, tmp_path: Path
):
    pid_file = tmp_path / "pid"
    (repository / "stuck" / "1").mkdir(parents=True)
    (repository / "stuck" / "1" / "model.py").write_text(
        textwrap.dedent(
            f"""
            import os
            import time

            class TritonPythonModel:
                def initialize(self, args):
                    with open({str(pid_file)!r}, "w") as file:
                        file.write(str(os.getpid()))
                    time.sleep(60)

                def execute(self, requests):
                    return []
            """
        )
    )
    (repository / "stuck" / "config.pbtxt").write_text(
        FRAGILE_CONFIG.replace('"fragile"', '"stuck"')
    )
    # Long enough for the child to start and reach initialize on a busy machine.
    with corral.Host(repository, load_timeout_s=4) as host:
        with pytest.raises(corral.ModelLoadError):
            host.infer("stuck", _how(0), timeout=20)
        pid = int(pid_file.read_text())
        wait_until(lambda: not _alive(pid), timeout=15)
        # The others are served meanwhile.
        assert host.infer("mlp", {"X": X})["Y"].shape == (3, 1)


def test_the_child_ends_when_the_server_dies(repository: Path):
    script = textwrap.dedent(
        f"""
        import os
        import numpy as np
        import corral

        host = corral.Host({str(repository)!r})
        out = host.infer("fragile", {{"HOW": np.array([0], np.int64)}})
        print(int(out["PID"][0]), flush=True)
        os._exit(0)  # no close: the child learns of it from its pipe
        """
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    pid = int(done.stdout.split()[-1])
    deadline = time.monotonic() + 15
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)  # polling another process's exit: nothing to wait on
    assert not _alive(pid)


def test_a_childs_unexpected_error_is_answered_as_an_inference_error():
    from corral._compute.python.worker import answer_error

    assert answer_error(KeyError("k")) == {"error": "InferenceError", "message": "'k'"}
    assert answer_error(KeyError("k"), keep_name=True)["error"] == "KeyError"
    assert answer_error(corral.InvalidInput("x"))["error"] == "InvalidInput"
