"""`corral serve --processes N`: N real processes behind one HTTP and one gRPC port.

Each server binds 127.0.0.1 on ports the OS picks and is stopped by SIGTERM to its own
process id (the parent's); its processes are found by the pids the parent logs.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import multiprocessing
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from corral import HostOptions
from corral.cli import main
from corral.server import processes
from corral.server.app import EXIT_DRAIN_INCOMPLETE, Addresses
from corral.server.group_member import EVERY_PROCESS_READY, GroupMember
from corral.server.ports import bind_shared
from corral.server.processes import process_settings, run_group
from corral.server.settings import ServerSettings
from corral.testing import build_mlp
from tests.helpers import add_model, build_slow_loop, reference_run
from tests.processes import (
    ServerProcess,
    sigterm_during_a_slow_request,
    start_server,
    stop_server,
)

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.usefixtures("garbage_collected_on_the_main_thread"),
]

X = np.random.default_rng(5).standard_normal((2, 4)).astype(np.float32)
_SERVING = re.compile(r"corral: (\d+) processes serve HTTP on \S+, gRPC \S+ \((.*)\)\n")


# -- the settings ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({"system_shared_memory": True}, "--system-shared-memory"),
        ({"model_control_mode": "explicit"}, "--model-control-mode explicit"),
        ({"cache_dir": "/tmp/corral-cache"}, "--cache-dir"),
        ({"max_request_bytes": 100, "max_body_bytes_in_flight": 150}, "--max-request-bytes 100"),
        ({"metrics_port": 65535}, "65536"),
        ({"metrics_port": 9000, "http_port": 9001}, "--http-port"),
    ],
)
def test_what_one_process_holds_is_refused_with_several_by_name(
    tmp_path: Path, given: dict[str, Any], named: str
):
    ServerSettings(repository=tmp_path, processes=1, **given)  # alone, each is served
    with pytest.raises(ValidationError) as raised:
        ServerSettings(repository=tmp_path, processes=2, **given)
    assert "--processes 2" in str(raised.value)
    assert named in str(raised.value)


def test_several_processes_are_refused_where_sockets_sharing_a_port_do_not_share_its_connections(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(sys, "platform", "darwin")
    ServerSettings(repository=tmp_path)
    with pytest.raises(ValidationError, match="--processes 2 needs Linux"):
        ServerSettings(repository=tmp_path, processes=2)


def test_corral_serve_refuses_them_before_starting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    status = main(["serve", str(tmp_path), "--processes", "2", "--system-shared-memory"])
    assert status == 2
    error = capsys.readouterr().err
    assert "--processes 2 cannot be given with --system-shared-memory" in error


def test_each_process_gets_its_share_of_what_is_counted_per_server(tmp_path: Path):
    settings = ServerSettings(
        repository=tmp_path,
        processes=3,
        memory_budget="3GiB",
        max_loaded_models=10,
        compute_workers=4,
        max_connections=300,
        grpc_max_connections=30,
        max_request_bytes=1000,
        max_body_bytes_in_flight=9000,
        metrics_port=9100,
        cache_config="local,size=3MiB",
    )
    second = process_settings(settings, 2)
    assert second.response_cache_bytes() == 2**20
    assert second.host_options().budget_bytes == 1024**3
    assert second.host_options().max_loaded_models == 3
    assert second.runtime_options().compute_workers == 1
    assert (second.max_connections, second.grpc_max_connections) == (100, 10)
    assert second.body_budget_bytes() == 3000
    assert second.metrics_port == 9101
    # What was not given stays each process's own default; nothing falls below one.
    alone = process_settings(
        ServerSettings(repository=tmp_path, processes=3, compute_workers=2, metrics_port=0), 3
    )
    # The automatic budget (half the memory limit) is the server's: each has its share.
    budget = HostOptions(memory_budget="auto").budget_bytes
    assert budget is not None
    assert alone.host_options().budget_bytes == budget // 3
    assert alone.max_connections is None
    assert alone.runtime_options().compute_workers == 1
    assert alone.metrics_port == 0
    assert alone.body_budget_bytes() == 4 * alone.max_request_bytes // 3


def test_a_process_hears_once_that_every_process_is_ready(caplog: pytest.LogCaptureFixture):
    ours, theirs = multiprocessing.Pipe()
    with socket.socket() as unused:
        member = GroupMember(1, 2, unused, theirs)

        async def hear() -> list[str]:
            loop = asyncio.get_running_loop()
            heard: list[str] = []
            told = asyncio.Event()
            member.wait_for_the_group(loop, lambda: (heard.append("ready"), told.set()))
            ours.send(("something else",))  # not understood: logged, still listening
            ours.send(EVERY_PROCESS_READY)
            await asyncio.wait_for(told.wait(), 30)
            return heard

        with caplog.at_level("ERROR", logger="corral.server.group_member"):
            assert asyncio.run(hear()) == ["ready"]
    assert "a message from the parent not understood: ('something else',)" in caplog.text
    ours.close()
    theirs.close()


def test_a_process_whose_parent_is_gone_logs_what_it_could_not_tell(
    caplog: pytest.LogCaptureFixture,
):
    ours, theirs = multiprocessing.Pipe()
    ours.close()
    with socket.socket() as unused:
        member = GroupMember(1, 2, unused, theirs)
        with caplog.at_level("WARNING", logger="corral.server.group_member"):
            member.report_serving(None)
            member.report_ready()
    theirs.close()
    assert "the parent process is gone; it was not told ('serving', 1," in caplog.text
    assert "the parent process is gone; it was not told ('ready', 1)" in caplog.text


def test_a_process_whose_parent_is_gone_stops_listening_for_it():
    ours, theirs = multiprocessing.Pipe()
    with socket.socket() as unused:
        member = GroupMember(1, 2, unused, theirs)

        async def hear() -> bool:
            loop = asyncio.get_running_loop()
            removed = asyncio.Event()
            remove = loop.remove_reader

            def spied(fd: int) -> bool:
                found = remove(fd)
                removed.set()
                return found

            loop.remove_reader = spied  # type: ignore[method-assign]
            member.wait_for_the_group(loop, lambda: pytest.fail("told ready by no one"))
            ours.close()  # the parent's end gone: the process reads EOF
            await asyncio.wait_for(removed.wait(), 30)
            return remove(theirs.fileno())  # nothing is left to remove

        assert asyncio.run(hear()) is False
    theirs.close()


# -- the processes ----------------------------------------------------------------------------


def start_group(repo: Path, log: Path, *flags: str) -> tuple[ServerProcess, dict[int, int]]:
    """``corral serve --processes 2``; its processes' pids by number, once every one serves."""
    served = start_server(repo, log, "--processes", "2", *flags)
    deadline = time.monotonic() + 60
    while (found := _SERVING.search(log.read_text())) is None:
        assert served.process.poll() is None, log.read_text()
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.02)
    assert found[1] == "2"
    pids = {int(n): int(pid) for n, pid in re.findall(r"(\d+): pid (\d+)", found[2])}
    assert sorted(pids) == [1, 2]
    return served, pids


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")


def infer_on_a_new_connection(address: str) -> tuple[int, dict[str, Any]]:
    host, port = address.split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        body = {
            "inputs": [
                {"name": "X", "shape": [2, 4], "datatype": "FP32", "data": X.ravel().tolist()}
            ]
        }
        connection.request("POST", "/v2/models/mlp/infer", json.dumps(body))
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def successes(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        text = response.read().decode()
    found = re.search(
        r'^nv_inference_request_success\{model="mlp",version="1"\} (\S+)$', text, re.M
    )
    return 0.0 if found is None else float(found[1])


def test_both_processes_answer_as_onnxruntime_does_and_count_their_own(tmp_path: Path):
    repo = tmp_path / "repository"
    model = build_mlp()
    add_model(repo, "mlp", model)
    (expected,) = reference_run(model, {"X": X})
    served, pids = start_group(repo, tmp_path / "group.log", "--metrics-port", "0")
    try:
        log = served.log.read_text()
        metrics = [int(port) for port in re.findall(r"metrics on port (\d+)", log)]
        assert len(metrics) == 2
        asked = 40
        for _ in range(asked):
            status, doc = infer_on_a_new_connection(served.http)
            assert status == 200, doc
            got = np.array(doc["outputs"][0]["data"], np.float32).reshape(expected.shape)
            np.testing.assert_allclose(got, expected, rtol=1e-6)
        counted = [successes(port) for port in metrics]
        # 40 connections spread by a hash of each: both processes took some (all 40 on one
        # would happen once in 2**39 runs), and between them, every one.
        assert all(count > 0 for count in counted), counted
        assert sum(counted) == asked
        # The shared port's /metrics would be one process's at random: refused by name.
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://{served.http}/metrics", timeout=30)
        assert refused.value.code == 404
        assert "--metrics-port" in refused.value.read().decode()
    finally:
        stop_server(served)
    assert all(gone(pid) for pid in pids.values())


def _second_loads_when_told(settings: ServerSettings, member: GroupMember) -> None:
    """A group's process; process 2 begins its --load-model loads once ``go`` exists."""
    if member.number == 2:
        from corral.protocol.model_control import ModelControl

        go = Path(settings.repository).parent / "go"
        preload = ModelControl.preload

        def late(control: ModelControl, *args: Any, **kwargs: Any) -> Any:
            deadline = time.monotonic() + 60
            while not go.exists():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{go} was not made within 60 s")
                time.sleep(0.01)
            return preload(control, *args, **kwargs)

        ModelControl.preload = late  # type: ignore[method-assign]
    processes._serve_member(settings, member)


def _ready_status(port: int) -> int:
    """``/v2/health/ready`` on a new connection: whichever process the kernel gives it."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=30) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def _mlp_ready_in_some_index(port: int) -> bool:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v2/repository/index", data=b"{}", method="POST"
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        return any(row.get("state") == "READY" for row in json.loads(answer.read()))


def test_no_process_reports_ready_until_every_one_has_loaded_its_models(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    repo = tmp_path / "repository"
    add_model(repo, "mlp", build_mlp())
    settings = ServerSettings(
        repository=repo, processes=2, load_model=["*"], grpc_port=-1, drain_timeout_s=5
    )
    group = processes._Group(settings, target=_second_loads_when_told)
    sockets = bind_shared("127.0.0.1", 0, 2)
    port = sockets[0].getsockname()[1]
    seen: dict[str, list[int]] = {}
    failures: list[BaseException] = []
    serving = threading.Event()  # the parent has logged that both processes serve

    class Serving(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "2 processes serve HTTP" in record.getMessage():
                serving.set()

    def probe() -> None:
        try:
            deadline = time.monotonic() + 60
            assert serving.wait(60), "the processes never served"
            # Process 1 has loaded the model (a connection to it lists it READY) ...
            while not _mlp_ready_in_some_index(port):
                assert time.monotonic() < deadline, "process 1 never loaded mlp"
            # ... and process 2 waits for `go`: whichever process answers, not ready.
            seen["held"] = [_ready_status(port) for _ in range(20)]
            (tmp_path / "go").touch()
            while (statuses := [_ready_status(port) for _ in range(20)]) != [200] * 20:
                assert time.monotonic() < deadline, f"still not ready everywhere: {statuses}"
            seen["released"] = statuses
        except BaseException as exc:
            failures.append(exc)
        finally:
            os.kill(os.getpid(), signal.SIGTERM)  # the group's handler: it stops them

    previous = signal.signal(signal.SIGTERM, group.on_signal)
    prober = threading.Thread(target=probe, name="probe")
    told = Serving()
    logging.getLogger("corral.server.processes").addHandler(told)
    try:
        for number, sock in enumerate(sockets, start=1):
            ports = {"http_port": port}
            group.start(process_settings(settings, number).model_copy(update=ports), number, sock)
            sock.close()
        prober.start()
        with caplog.at_level("INFO", logger="corral.server.processes"):
            status = group.wait(Addresses("127.0.0.1", port, None))
    finally:
        logging.getLogger("corral.server.processes").removeHandler(told)
        signal.signal(signal.SIGTERM, previous)
        group.close()
        for sock in sockets:
            sock.close()
        prober.join(60)
    assert not failures, failures
    # Before every process had loaded, one in two of these reached process 1, loaded.
    assert seen["held"] == [503] * 20
    assert seen["released"] == [200] * 20
    assert status == 0
    assert "all 2 processes are ready" in caplog.text


def test_the_repository_api_load_and_unload_are_refused_naming_processes(tmp_path: Path):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    repo = tmp_path / "repository"
    add_model(repo, "mlp", build_mlp())
    served, _ = start_group(repo, tmp_path / "control.log")
    try:
        for action in ("load", "unload"):
            request = urllib.request.Request(
                f"http://{served.http}/v2/repository/models/mlp/{action}", data=b"", method="POST"
            )
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=30)
            assert refused.value.code == 501
            assert "--processes 2" in refused.value.read().decode()
        with pytest.raises(urllib.error.HTTPError) as no_metrics:
            urllib.request.urlopen(f"http://{served.http}/metrics", timeout=30)
        assert "--metrics-port P" in no_metrics.value.read().decode()
        client = grpcclient.InferenceServerClient(served.grpc)
        try:
            with pytest.raises(InferenceServerException) as rpc:
                client.load_model("mlp")
            assert rpc.value.status() == "StatusCode.UNIMPLEMENTED"
            assert "--processes 2" in rpc.value.message()
            # gRPC is served on the port the processes share.
            inputs = [grpcclient.InferInput("X", [2, 4], "FP32")]
            inputs[0].set_data_from_numpy(X)
            answer = client.infer("mlp", inputs).as_numpy("Y")
            assert answer is not None
            np.testing.assert_allclose(answer, reference_run(build_mlp(), {"X": X})[0], rtol=1e-6)
        finally:
            client.close()
    finally:
        stop_server(served)


def test_sigterm_to_the_parent_drains_the_request_in_flight_in_its_process(tmp_path: Path):
    repo = tmp_path / "repository"
    add_model(repo, "slow", build_slow_loop())
    served, pids = start_group(repo, tmp_path / "drain.log", "--drain-timeout-s", "120")
    status, doc = sigterm_during_a_slow_request(served)
    assert (status, doc["outputs"][0]["data"]) == (200, [1_500_000.0])
    assert served.process.wait(timeout=30) == 0, served.log.read_text()
    log = served.log.read_text()
    # The parent passed the signal on once to each; each drained and stopped.
    assert "SIGTERM received, stopping 2 processes" in log
    for number in pids:
        assert f"[process {number}] corral.server.app: corral: SIGTERM received, draining" in log
        assert f"[process {number}] corral.server.app: corral: stopped" in log
    assert all(gone(pid) for pid in pids.values())


def test_a_process_that_dies_ends_the_group_with_status_1(tmp_path: Path):
    repo = tmp_path / "repository"
    add_model(repo, "mlp", build_mlp())
    served, pids = start_group(repo, tmp_path / "died.log")
    os.kill(pids[2], signal.SIGKILL)
    try:
        status = served.process.wait(timeout=60)
    finally:
        if served.process.poll() is None:
            served.process.kill()
    log = served.log.read_text()
    assert status == 1, log
    assert f"process 2 (pid {pids[2]}) ended on its own (exit status -9)" in log
    assert "[process 1] corral.server.app: corral: stopped" in log
    assert gone(pids[1])


def test_the_processes_drain_and_exit_when_their_parent_is_killed(tmp_path: Path):
    repo = tmp_path / "repository"
    add_model(repo, "mlp", build_mlp())
    served, pids = start_group(repo, tmp_path / "orphans.log")
    served.process.kill()
    served.process.wait(timeout=30)
    deadline = time.monotonic() + 60
    while not all(gone(pid) for pid in pids.values()):
        assert time.monotonic() < deadline, served.log.read_text()
        time.sleep(0.05)
    log = served.log.read_text()
    for number in pids:
        assert (
            f"[process {number}] corral.server.group_member: corral: the parent process has ended"
            in log
        )
        assert f"[process {number}] corral.server.app: corral: stopped" in log


def test_a_port_in_use_is_named_once_before_any_process_starts(tmp_path: Path):
    repo = tmp_path / "repository"
    add_model(repo, "mlp", build_mlp())
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        log = tmp_path / "taken.log"
        command = ["serve", str(repo), "--processes", "2", "--http-port", str(port)]
        command += ["--grpc-port", "-1"]
        with log.open("wb") as sink:
            status = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    "import sys; from corral.cli import main; sys.exit(main())",
                    *command,
                ],
                stdout=sink,
                stderr=subprocess.STDOUT,
                timeout=60,
                env={k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")},
            ).returncode
    text = log.read_text()
    assert status == 1, text
    assert text.count(f"port {port} (--http-port) on 127.0.0.1 is in use") == 1, text
    assert "[process" not in text


# -- the parent's own bounds ------------------------------------------------------------------


def _group_of_one(
    settings: ServerSettings,
    target: Callable[[ServerSettings, GroupMember], None],
    caplog: pytest.LogCaptureFixture,
) -> int:
    """Process 1 alone, running ``target``, waited for as run_group waits; the exit status."""
    group = processes._Group(settings, target=target)
    # As run_group does: a stop signal is the group's.
    previous = signal.signal(signal.SIGTERM, group.on_signal)
    try:
        (sock,) = bind_shared("127.0.0.1", 0, 1)
        try:
            group.start(settings, 1, sock)
        finally:
            sock.close()
        with caplog.at_level("INFO", logger="corral.server.processes"):
            return group.wait(Addresses("127.0.0.1", 0, None))
    finally:
        signal.signal(signal.SIGTERM, previous)
        group.close()


def _deaf(settings: ServerSettings, member: GroupMember) -> None:
    """A process that ignores SIGTERM, then asks its parent to stop (gone in 60 s anyway)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.alarm(60)
    os.kill(os.getppid(), signal.SIGTERM)
    while True:
        signal.pause()


def test_a_process_still_running_past_its_bound_after_the_stop_is_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    # Its bound: the drain timeout and notice, EXIT_MARGIN_S, then KILL_MARGIN_S.
    monkeypatch.setattr(processes, "EXIT_MARGIN_S", 0.0)
    monkeypatch.setattr(processes, "KILL_MARGIN_S", 0.5)
    settings = ServerSettings(repository=tmp_path, processes=2, drain_timeout_s=0, grpc_port=-1)
    # The process sends the stop signal once deaf.
    status = _group_of_one(settings, _deaf, caplog)
    assert status == EXIT_DRAIN_INCOMPLETE
    assert "SIGTERM received, stopping 1 processes" in caplog.text
    assert "has not exited 0.5 s after the stop: killed" in caplog.text


def _garbled(settings: ServerSettings, member: GroupMember) -> None:
    """A process that says what its parent does not understand, then waits to be stopped."""
    signal.alarm(60)  # gone in 60 s anyway
    member.reports.send(("hello",))
    while True:
        signal.pause()


def test_a_message_not_understood_stops_the_group_with_status_1(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    settings = ServerSettings(repository=tmp_path, processes=2, drain_timeout_s=0, grpc_port=-1)
    status = _group_of_one(settings, _garbled, caplog)
    assert status == processes.EXIT_PROCESS_ENDED
    assert "process 1 sent a message not understood (('hello',)): stopping" in caplog.text


def test_a_metrics_port_of_a_later_process_in_use_is_named_before_any_starts(tmp_path: Path):
    with socket.socket() as first, socket.socket() as holder:
        # Two neighbouring ports: the first free for process 1, the next held.
        first.bind(("127.0.0.1", 0))
        port = first.getsockname()[1]
        first.close()
        try:
            holder.bind(("127.0.0.1", port + 1))
        except OSError:
            pytest.skip(f"port {port + 1} is taken already")
        holder.listen()
        settings = ServerSettings(
            repository=tmp_path, processes=2, metrics_port=port, http_port=0, grpc_port=-1
        )
        with pytest.raises(OSError, match=rf"another process holds {port + 1}$"):
            run_group(settings)


def test_a_port_held_without_sharing_cannot_be_bound_for_the_processes():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        with pytest.raises(OSError, match="in use"):
            bind_shared("127.0.0.1", holder.getsockname()[1], 2)
