"""corral on a Ray cluster of two nodes on this machine, one of them killed under load.

Issue 50, part 4. Two plans: ``make soak``'s (12 tiny models, 4 callers, 10 s of load before
the kill and 10 s of nothing but 200 after the recovery: about a minute on 2 cores) and
``make test``'s short one (4 tiny models, 2 callers, 1 s each side: about 35 s). Each node is
a ``ray start --block`` of its own, in a session of its own, with its own ``--temp-dir``,
ports and CPUs; the node is that process and its descendants (the raylet, Ray's agents and
every worker the raylet starts). The repository is in an ``s3://`` bucket on moto's server,
and no model file is shared: in the soak plan each node's replicas cache it under that
node's own temporary folder (no ``--cache-dir``: a new folder per replica process); in the
short plan under ``--cache-dir``, where each replica claims a ``replica-<n>`` folder of its
own, as on a cluster whose nodes each have that path on a disk of their own.

Placement. The head has one CPU, and ``--replica-cpus 1``: the head holds the ingress and one
model replica, and the second replica waits for the second node, started only once the
ingress runs on the head. Killing the second node (SIGKILL to all its processes) then takes
one model replica with it, and nothing else of the application's. Which replica runs where
is read from each node's own Serve logs (a file per replica, named with the tag the
``corral-replica`` header carries).

The load: callers asking every tiny model in turn, and one caller asking a slow model (a
second or so a run) that the second node's replica holds; the node is killed once that
caller's request has been in flight for SLOW_RUNNING_S, so that one is running there.

Clients send every request to the head's Serve proxy (Ray starts one on each node with a
replica; the second node's listens on a port of its own, ``RAY_SERVE_WORKER_PROXY_HTTP_PORT``,
rather than sharing the head's through ``SO_REUSEPORT``): behind a load balancer, a request
to a dead node's proxy is the balancer's to retry, not corral's to answer.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ray.serve", reason="the ray extra is not installed")
pytest.importorskip("moto", reason="moto's server holds the repository")

import httpx
import psutil

from tests import s3server
from tests.helpers import add_model, build_slow_loop, load_benchmark, reference_run
from tests.processes import group_alive

build_repository = load_benchmark("footprint.py").build_repository

pytestmark = [
    pytest.mark.ray,
    pytest.mark.timeout(900),
    pytest.mark.usefixtures("garbage_collected_on_the_main_thread"),
]

RAY = str(Path(sys.executable).with_name("ray"))
# Slow models, asked in turn until one is routed to the second node's replica.
SLOW_MODELS = 6
# Iterations of a slow model's run: about a second on one loaded core. Its answer is exact.
SLOW_ITERATIONS = 500_000
# The node is killed once the slow model's request has been in flight this long: running.
SLOW_RUNNING_S = 0.3
# Every wait is bounded: a request, a node's start, the application's start, the recovery.
REQUEST_TIMEOUT_S = 30.0
NODE_START_TIMEOUT_S = 120.0
APP_START_TIMEOUT_S = 300.0
RECOVERY_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 90.0
# An answer other than 200 that the goal allows: corral's typed JSON error.
TYPED = {503, 429}


@dataclass(frozen=True)
class Plan:
    """How much load a run puts on the cluster; the kill and the checks are the same."""

    models: int  # tiny models, asked in turn by every caller
    callers: int  # callers of the tiny models, beside the slow model's
    steady_s: float  # load before the kill, and the stretch of nothing but 200 after it
    cache_dir: bool  # replicas cache under --cache-dir's claimed folders, else TMPDIR's


SOAK = Plan(models=12, callers=4, steady_s=10.0, cache_dir=False)
SHORT = Plan(models=4, callers=2, steady_s=1.0, cache_dir=True)


@dataclass
class Node:
    """One ``ray start --block`` process and its descendants: the node.

    Not its process group: Ray 2.60's raylet puts each worker in a group of its own
    (``RAY_process_group_cleanup_enabled``), so a signal to the node's group leaves its
    workers, a model replica among them, running and answering.
    """

    name: str
    process: subprocess.Popen[bytes]
    temp_dir: str
    log: Path
    # Every process of the node seen so far, so that none may outlive it unnoticed.
    seen: set[int] = field(default_factory=set)

    def tree(self) -> list[psutil.Process]:
        """The ``ray start`` process and its descendants now (remembered in ``seen``)."""
        try:
            root = psutil.Process(self.process.pid)
            found = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []
        self.seen.update(process.pid for process in found)
        return found

    def replicas(self, deployment: str) -> int:
        """How many of the deployment's replicas run on this node."""
        count = 0
        for process in self.tree():
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                count += f"ServeReplica:corral:{deployment}" in " ".join(process.cmdline())
        return count

    def replica_tags(self, deployment: str) -> set[str]:
        """The tags of the deployment's replicas that ran on this node, from its Serve logs."""
        logs = Path(self.temp_dir, "session_latest", "logs", "serve")
        prefix = f"replica_corral_{deployment}_"
        return {path.stem.removeprefix(prefix) for path in logs.glob(f"{prefix}*.log")}

    def listening(self) -> set[str]:
        """The addresses the node's processes listen on (TCP)."""
        found = set()
        for process in self.tree():
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                for connection in process.net_connections(kind="tcp"):
                    if connection.status == psutil.CONN_LISTEN:
                        found.add(connection.laddr.ip)
        return found

    def survivors(self) -> list[int]:
        """The node's processes seen so far that still run (a zombie does not)."""
        running = []
        for pid in sorted(self.seen):
            with contextlib.suppress(psutil.NoSuchProcess):
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    running.append(pid)
        return running

    def kill(self) -> None:
        """SIGKILL to every process of the node: the raylet, Ray's agents and every worker.

        The whole tree is stopped first (SIGSTOP, until no new process shows up), so that
        none starts another one between the listing and the kill.
        """
        stopped: dict[int, psutil.Process] = {}
        while new := [p for p in self.tree() if p.pid not in stopped]:
            for process in new:
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.send_signal(signal.SIGSTOP)
                stopped[process.pid] = process
        for process in stopped.values():
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)
        self.wait_gone()

    def wait_gone(self) -> None:
        """Wait until no process of the node runs (bounded: 30 s)."""
        deadline = time.monotonic() + 30
        while self.survivors() and time.monotonic() < deadline:
            time.sleep(0.1)

    def stop(self) -> None:
        """Take the node down at the end: every process of it killed, as :meth:`kill` does.

        The nodes are the test's cluster, not corral: ``ray start --block`` stopping its own
        head after SIGTERM takes about 30 s once the cluster has lost a node (Ray 2.60), most
        of the test's time for nothing it checks. Nothing of the node may outlive it.
        """
        if self.process.poll() is None:
            self.kill()
        self.wait_gone()


def start_node(
    name: str, tmp_path: Path, env: dict[str, str], *arguments: str, cpus: int = 1
) -> Node:
    """``ray start --block`` in a session of its own, with every port of its own; waits."""
    free = s3server.free_port
    # Short: Ray's Unix sockets live under it, and a socket's path has at most 107 bytes.
    temp_dir = tempfile.mkdtemp(prefix=f"corral-{name}-", dir="/tmp")
    command = [
        RAY,
        "start",
        "--block",
        "--node-ip-address",
        "127.0.0.1",
        "--num-cpus",
        str(cpus),
        "--temp-dir",
        temp_dir,
        "--disable-usage-stats",
        "--object-store-memory",
        str(200 * 2**20),
        # The defaults are fixed ports (the agent's 52365 among them): another Ray on this
        # machine, or the other node, would already hold them.
        *("--node-manager-port", str(free()), "--object-manager-port", str(free())),
        *("--dashboard-agent-listen-port", str(free())),
        *("--dashboard-agent-grpc-port", str(free())),
        *("--runtime-env-agent-port", str(free()), "--metrics-export-port", str(free())),
        *arguments,
    ]
    log = tmp_path / f"ray-{name}.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            command, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    node = Node(name, process, temp_dir, log)
    deadline = time.monotonic() + NODE_START_TIMEOUT_S
    while "block forever" not in log.read_text(errors="replace"):
        if process.poll() is not None or time.monotonic() > deadline:
            node.stop()
            shutil.rmtree(temp_dir)
            raise AssertionError(f"ray node {name} did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    return node


@contextlib.contextmanager
def nodes_stopped(nodes: list[Node]) -> Iterator[None]:
    """Stop every node started in the block, newest first, and remove their temp dirs."""
    try:
        yield
    finally:
        for node in reversed(nodes):
            node.stop()
        for node in nodes:
            shutil.rmtree(node.temp_dir)


def wait_for(
    what: str, done: Callable[[], object], timeout_s: float, log: Path, poll_s: float = 0.5
) -> None:
    """Poll ``done`` every ``poll_s`` until it is true; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not within {timeout_s:.0f} s:\n{log.read_text()[-4000:]}")
        time.sleep(poll_s)


@dataclass(frozen=True)
class Model:
    """A model the test asks: its request body and onnxruntime's answer to it."""

    name: str
    body: dict[str, object]
    expected: np.ndarray


@dataclass(frozen=True)
class Answer:
    """One request: when it was sent and answered (monotonic), and how."""

    sent: float
    done: float
    model: str
    status: int  # 0 when no HTTP answer came (a timeout, a reset connection)
    outcome: str  # "ok", "typed" (503/429 with corral's JSON error), or what was wrong
    replica: str
    error: str = ""  # a typed error's message


def ask(http: httpx.Client, model: Model) -> Answer:
    """One inference request, judged: the right answer, a typed error, or what went wrong."""
    sent = time.monotonic()
    try:
        response = http.post(f"/v2/models/{model.name}/infer", json=model.body)
    except httpx.HTTPError as exc:
        return Answer(sent, time.monotonic(), model.name, 0, f"no answer: {exc!r}", "")
    done = time.monotonic()
    replica = response.headers.get("corral-replica", "")
    if response.status_code == 200:
        [output] = response.json()["outputs"]
        answer = np.asarray(output["data"], np.float32).reshape(output["shape"])
        right = np.allclose(answer, model.expected, rtol=1e-5, atol=1e-6)
        outcome = "ok" if right else f"wrong: {answer}"
        return Answer(sent, done, model.name, 200, outcome, replica)
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        error = None
    if response.status_code in TYPED and isinstance(error, str):
        return Answer(sent, done, model.name, response.status_code, "typed", replica, error)
    outcome = f"untyped: {response.text[:300]}"
    return Answer(sent, done, model.name, response.status_code, outcome, replica)


def build_models(local: Path, count: int) -> list[Model]:
    """``count`` tiny models, then the slow ones, laid out under ``local``; with their answers."""
    files = build_repository(local, count)
    rng = np.random.default_rng(23)
    models = []
    for path in files:
        x = rng.standard_normal((2, 4)).astype(np.float32)
        tensor = {"name": "X", "datatype": "FP32", "shape": [2, 4], "data": x.ravel().tolist()}
        y = reference_run(path.read_bytes(), {"X": x})[0]
        models.append(Model(path.parent.parent.name, {"inputs": [tensor]}, y))
    slow = build_slow_loop()
    body = {
        "inputs": [
            {"name": "M", "datatype": "INT64", "shape": [], "data": [SLOW_ITERATIONS]},
            {"name": "start", "datatype": "FP32", "shape": [1], "data": [0.0]},
        ]
    }
    expected = reference_run(
        slow, {"M": np.array(SLOW_ITERATIONS), "start": np.zeros(1, np.float32)}
    )
    for index in range(SLOW_MODELS):
        add_model(local, f"slow{index}", slow, toml="max_batch_size = 0\n")
        models.append(Model(f"slow{index}", body, expected[0]))
    return models


@pytest.mark.parametrize(
    "plan", [pytest.param(SHORT, id="short"), pytest.param(SOAK, id="soak", marks=pytest.mark.soak)]
)
def test_a_node_killed_under_load_leaves_every_model_answered(tmp_path: Path, plan: Plan):
    """Two nodes, a replica on each; SIGKILL every process of the second node mid-load.

    Every request answers 200 with onnxruntime's answer or a typed 503/429, none waits past
    its client timeout, and every model answers 200 again from the head's replica within
    RECOVERY_TIMEOUT_S.
    """
    local = tmp_path / "built"
    models = build_models(local, plan.models)
    tiny = models[: plan.models]

    answers: list[Answer] = []
    # Guards answers: the callers append, the main thread reads.
    answers_lock = threading.Lock()
    killed_at = recovered_at = 0.0
    nodes: list[Node] = []
    with (
        s3server.running(tmp_path / "moto.log") as server,
        nodes_stopped(nodes),
    ):
        store = s3server.client(server)
        store.create_bucket(Bucket="fleet")
        for path in sorted(path for path in local.rglob("*") if path.is_file()):
            key = f"models/{path.relative_to(local).as_posix()}"
            store.put_object(Bucket="fleet", Key=key, Body=path.read_bytes())
        shutil.rmtree(local)  # the repository is in the store and nowhere else

        base = {k: v for k, v in os.environ.items() if not k.startswith(("CORRAL_", "RAY_"))}
        # Ray's token authentication, with a token of this test's own: every node and the
        # driver carry it, and nothing is read from or written to ~/.ray.
        base |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
        base |= {"RAY_USAGE_STATS_ENABLED": "0"} | server.environment()
        caches = {name: tmp_path / f"cache-{name}" for name in ("head", "second")}
        cache_dir = tmp_path / "cache"
        for folder in caches.values():
            folder.mkdir()
        # Each node's replicas make their store caches in its own temporary folder.
        head_env = base | {"TMPDIR": str(caches["head"])}
        second_env = base | {
            "TMPDIR": str(caches["second"]),
            "RAY_SERVE_WORKER_PROXY_HTTP_PORT": str(s3server.free_port()),
        }

        gcs_port = s3server.free_port()
        head = start_node(
            "head",
            tmp_path,
            head_env,
            "--head",
            *("--port", str(gcs_port), "--include-dashboard", "false"),
            *("--ray-client-server-port", str(s3server.free_port())),
        )
        nodes.append(head)

        serve_log = tmp_path / "ray-serve.log"
        command = [
            sys.executable,
            "-c",
            "import sys; from corral.cli import main; sys.exit(main())",
            "ray-serve",
            "s3://fleet/models",
            *("--address", f"127.0.0.1:{gcs_port}", "--port", str(s3server.free_port())),
            *("--replicas", "2", "--replica-cpus", "1", "--memory-budget", "1GiB"),
            # Two compute workers a replica: the slow model's runs hold one, not the tiny ones.
            *("--compute-workers", "2"),
            *(("--cache-dir", str(cache_dir)) if plan.cache_dir else ()),
        ]
        with serve_log.open("wb") as sink:
            launcher = subprocess.Popen(
                command, stdout=sink, stderr=subprocess.STDOUT, env=head_env, start_new_session=True
            )
        try:
            # The head fits the ingress and one replica; the second replica waits for a node.
            wait_for(
                "the ingress and a replica on the head",
                lambda: head.replicas("corral-ingress") == 1 and head.replicas("corral-models"),
                APP_START_TIMEOUT_S,
                serve_log,
            )
            second = start_node(
                "second", tmp_path, second_env, "--address", f"127.0.0.1:{gcs_port}"
            )
            nodes.append(second)
            pattern = r"corral ray-serve: serving .* at (http://[\d.]+:\d+)"
            wait_for(
                "corral ray-serve's start",
                lambda: re.search(pattern, serve_log.read_text()),
                APP_START_TIMEOUT_S,
                serve_log,
            )
            [url] = re.findall(pattern, serve_log.read_text())
            placement = {
                node.name: (node.replicas("corral-ingress"), node.replicas("corral-models"))
                for node in nodes
            }
            assert placement == {"head": (1, 1), "second": (0, 1)}, placement
            [head_tag] = head.replica_tags("corral-models")
            [second_tag] = second.replica_tags("corral-models")

            with httpx.Client(base_url=url, timeout=REQUEST_TIMEOUT_S) as http:
                # Every tiny model answers once, from both replicas between them.
                first = [ask(http, model) for model in tiny]
                assert all(answer.outcome == "ok" for answer in first), first
                # The slow models in turn, until one is the second node's.
                for model in models[plan.models :]:
                    answer = ask(http, model)
                    assert answer.outcome == "ok", answer
                    first.append(answer)
                    if answer.replica == second_tag:
                        break
            holder = {answer.model: answer.replica for answer in first}
            assert set(holder.values()) == {head_tag, second_tag}, holder
            [slow] = [m for m in models[plan.models :] if holder.get(m.name) == second_tag]
            if plan.cache_dir:
                # Each replica claimed a folder of --cache-dir and caches what it serves there.
                folders = sorted(path.name for path in cache_dir.iterdir() if path.is_dir())
                assert folders == ["replica-0", "replica-1"], folders
                for folder in folders:
                    assert list((cache_dir / folder / ".manifests").glob("*.json")), folder
            else:
                # Each node's replica caches what it serves in that node's own folder (the
                # head's is removed with its Store at the end).
                for node, folder in caches.items():
                    assert list(folder.glob("corral-store-*/.manifests/*.json")), node

            stop_load = threading.Event()
            # When each caller's request in flight now was sent (guarded by answers_lock).
            in_flight: dict[str, float] = {}

            def call(order: list[Model]) -> None:
                with httpx.Client(base_url=url, timeout=REQUEST_TIMEOUT_S) as http:
                    while not stop_load.is_set():
                        for model in order:
                            with answers_lock:
                                in_flight[threading.current_thread().name] = time.monotonic()
                            answer = ask(http, model)
                            with answers_lock:
                                del in_flight[threading.current_thread().name]
                                answers.append(answer)

            def slow_running() -> bool:
                # Sent a while ago and not answered: running (or queued) on the second node.
                with answers_lock:
                    sent = in_flight.get("slow-caller")
                return sent is not None and time.monotonic() - sent > SLOW_RUNNING_S

            orders = [
                tiny[i * plan.models // plan.callers :] + tiny[: i * plan.models // plan.callers]
                for i in range(plan.callers)
            ]
            callers = [
                threading.Thread(target=call, args=(order,), name=f"caller-{index}")
                for index, order in enumerate(orders)
            ]
            callers.append(threading.Thread(target=call, args=([slow],), name="slow-caller"))
            asked = {model.name for model in [*tiny, slow]}
            for caller in callers:
                caller.start()
            try:
                stop_load.wait(plan.steady_s)
                wait_for(
                    "a slow request in flight", slow_running, REQUEST_TIMEOUT_S, serve_log, 0.02
                )
                killed_at = time.monotonic()
                second.kill()
                assert not second.survivors(), "the second node's processes outlived SIGKILL"

                def recovered() -> bool:
                    # Every model answered 200 since the last answer that was not (the
                    # recovery), then nothing but 200 for plan.steady_s.
                    nonlocal recovered_at
                    with answers_lock:
                        since = [a for a in answers if a.sent > killed_at]
                    last_bad = max((a.done for a in since if a.outcome != "ok"), default=killed_at)
                    first_ok: dict[str, float] = {}
                    for a in since:
                        if a.sent > last_bad and a.outcome == "ok":
                            first_ok[a.model] = min(a.done, first_ok.get(a.model, a.done))
                    if set(first_ok) != asked:
                        return False
                    recovered_at = max(first_ok.values())
                    return time.monotonic() - recovered_at >= plan.steady_s

                wait_for("every model answered 200 again", recovered, RECOVERY_TIMEOUT_S, serve_log)
            finally:
                stop_load.set()
                for caller in callers:
                    caller.join(timeout=REQUEST_TIMEOUT_S + 10)
            assert not any(caller.is_alive() for caller in callers)
            head_listens = head.listening()
        finally:
            launcher.send_signal(signal.SIGTERM)
            try:
                code = launcher.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(launcher.pid, signal.SIGKILL)
                launcher.wait(timeout=30)
                raise
    deadline = time.monotonic() + 30
    while group_alive(launcher.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    survivors = [f"{node.name}: {node.survivors()}" for node in nodes if node.survivors()]
    if group_alive(launcher.pid):
        survivors.append("corral ray-serve")

    phases = {
        "before the kill": [a for a in answers if a.done <= killed_at],
        "in flight at the kill": [a for a in answers if a.sent <= killed_at < a.done],
        "sent during the recovery": [a for a in answers if killed_at < a.sent <= recovered_at],
        "after": [a for a in answers if a.sent > recovered_at],
    }
    for phase, group in phases.items():
        waits = sorted(a.done - a.sent for a in group) or [0.0]
        print(
            f"ray cluster, {phase} ({len(group)} requests): "
            f"{dict(collections.Counter(a.status for a in group))}; answered in "
            f"{waits[len(waits) // 2]:.3f} s (median), {waits[-1]:.2f} s (slowest)"
        )
    moved = {name for name, tag in holder.items() if tag == second_tag}
    # When each of the second node's models first answered 200 after the kill.
    back = [
        min(a.done for a in answers if a.sent > killed_at and a.model == m and a.outcome == "ok")
        for m in moved
    ]
    # The slow model's caller has one request in flight at a time: the one at the kill.
    running = [
        f"{a.status} after {a.done - killed_at:.1f} s"
        for a in answers
        if a.model == slow.name and a.sent <= killed_at < a.done
    ]
    print(
        f"ray cluster: {len(answers)} requests over {len(asked)} models, {len(callers)} "
        f"callers; {len(moved)} models on the killed node answered 200 again "
        f"{min(back) - killed_at:.1f}-{max(back) - killed_at:.1f} s after the kill, "
        f"every model {recovered_at - killed_at:.1f} s after it; the request running there "
        f"at the kill: {running or 'none'}; "
        f"the head listens on {sorted(head_listens)}"
    )
    errors = collections.Counter(
        re.sub(r"\b[0-9a-f]{8,}\b", "…", a.error)[:160] for a in answers if a.error
    )
    for error, count in errors.most_common():
        print(f"ray cluster: {count} x {error}")
    wrong = [a for a in answers if a.outcome not in ("ok", "typed")]
    assert not wrong, wrong[:10]
    assert all(a.done - a.sent < REQUEST_TIMEOUT_S for a in answers)
    # After the recovery, only the head's replica answers: no node is left for another.
    assert {a.replica for a in phases["after"]} == {head_tag}
    assert code == 0, serve_log.read_text()[-5000:]
    assert not survivors, f"processes outlived the test: {survivors}"
