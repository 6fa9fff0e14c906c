"""One hot model among many cold ones on Ray: its throughput on N replicas against one.

Issue 50's goal: one hot model among 1,000 cold ones on 3 replicas gets at least 0.8 x 3 x one
replica's throughput, and the cold models' p99 stays within 1.5x of the same run without the
hot model. Two ``corral ray-serve`` deployments on a local Ray node (one after the other,
bound to 127.0.0.1, stopped by their launcher's process id), each serving one repository: the
footprint benchmark's ``--models`` tiny models and ``hot``, a Loop model whose run adds 1.0
``--hot-iterations`` times (``tests/helpers.py``'s ``build_slow_loop``; 25,000 take about 33 ms
of one core here):

1. **one replica**: ``--hot-callers`` threads send ``hot`` requests for ``--seconds``; its
   throughput is *one replica's*;
2. **N replicas** (``--replicas``): the hot callers alone (*hot alone*), then
   ``--cold-callers`` threads ask random cold models
   for ``--seconds`` (*cold alone*: their p99), then the same cold callers with the hot
   callers beside them (*hot with cold*: the hot model's throughput and the cold p99).

Each replica gets ``--replica-cpus`` (1 compute worker) and the ingress spreads the hot model
past ``--hot-model-in-flight`` requests in flight. Every answer is checked (the Loop adds 1.0
``M`` times); a request that fails is counted and named; the hot model's answers are counted
by the replica that gave them. Beside each phase, the machine's
busy share of its cores (``/proc/stat``): on a machine with fewer cores than replicas, the
replicas' runs share them, and the goal's 3 x cannot be reached whatever the routing::

    python benchmarks/ray_hot.py [--models 1000] [--replicas 3] [--seconds 20] [--json FILE]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import platform
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from benchmarks.footprint import build_repository  # noqa: E402
from tests.helpers import add_model, build_slow_loop  # noqa: E402

_START_TIMEOUT_S = 300.0
_STOP_TIMEOUT_S = 90.0


@dataclass
class Tally:
    """One caller group's answers during a phase."""

    latencies_s: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    #: Right answers by the replica that gave them (its ``corral-replica`` header).
    replicas: collections.Counter[str] = field(default_factory=collections.Counter)
    # Guards latencies_s, failures and replicas: every caller thread of the group adds.
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, seconds: float, failure: str | None, replica: str = "") -> None:
        """Count one answer (``failure``: why it was not the right one)."""
        with self.lock:
            if failure is None:
                self.latencies_s.append(seconds)
                self.replicas[replica] += 1
            else:
                self.failures.append(failure)

    def summary(self, seconds: float) -> dict[str, Any]:
        """Answers a second, p50 and p99 in milliseconds, failures (the first five named)."""
        ordered = sorted(self.latencies_s)

        def quantile(q: float) -> float | None:
            if not ordered:
                return None
            return round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)

        return {
            "answers": len(ordered),
            "per_s": round(len(ordered) / seconds, 1),
            "p50_ms": quantile(0.5),
            "p99_ms": quantile(0.99),
            "failures": len(self.failures),
            "failed": self.failures[:5],
            "by_replica": sorted(self.replicas.values(), reverse=True),
        }


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextlib.contextmanager
def deployment(
    repository: Path, replicas: int, settings: argparse.Namespace, log: Path
) -> Iterator[str]:
    """``corral ray-serve`` with ``replicas`` replicas; yields its address, stops it after."""
    port = free_port()
    command = [
        sys.executable,
        "-c",
        "import sys; from corral.cli import main; sys.exit(main())",
        "ray-serve",
        str(repository),
        "--port",
        str(port),
        "--replicas",
        str(replicas),
        "--replica-cpus",
        str(settings.replica_cpus),
        "--compute-workers",
        "1",
        "--hot-model-in-flight",
        str(settings.hot_model_in_flight),
        "--log-level",
        "warning",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORRAL_", "RAY_"))}
    with log.open("wb") as sink:
        process = subprocess.Popen(
            command, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while True:
            if re.search(r"corral ray-serve: serving .* at http://", log.read_text()):
                break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"corral ray-serve did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)


def busy_share() -> tuple[int, int]:
    """The machine's busy and total CPU ticks so far (``/proc/stat``)."""
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def run_phase(
    address: str,
    names: Sequence[str],
    hot_callers: int,
    cold_callers: int,
    seconds: float,
    hot_iterations: int,
) -> dict[str, Any]:
    """Callers for ``seconds``: hot ones on ``hot``, cold ones on random ``names``."""
    import httpx

    hot, cold = Tally(), Tally()
    stop = threading.Event()
    hot_body = {
        "inputs": [
            {"name": "M", "datatype": "INT64", "shape": [], "data": [hot_iterations]},
            {"name": "start", "datatype": "FP32", "shape": [1], "data": [0.0]},
        ]
    }
    cold_body = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4], "data": [1.0] * 4}]}

    def call_hot() -> None:
        with httpx.Client(base_url=f"http://{address}", timeout=60) as http:
            while not stop.is_set():
                started = time.perf_counter()
                failure = None
                replica = ""
                try:
                    answer = http.post("/v2/models/hot/infer", json=hot_body)
                    replica = answer.headers.get("corral-replica", "")
                    if answer.status_code != 200:
                        failure = f"{answer.status_code} {answer.text[:200]}"
                    elif answer.json()["outputs"][0]["data"] != [float(hot_iterations)]:
                        failure = f"wrong answer {answer.text[:200]}"
                except httpx.HTTPError as exc:
                    failure = repr(exc)
                hot.add(time.perf_counter() - started, failure, replica)

    def call_cold(seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(base_url=f"http://{address}", timeout=60) as http:
            while not stop.is_set():
                name = rng.choice(names)
                started = time.perf_counter()
                failure = None
                try:
                    answer = http.post(f"/v2/models/{name}/infer", json=cold_body)
                    if answer.status_code != 200:
                        failure = f"{name}: {answer.status_code} {answer.text[:200]}"
                    elif len(answer.json()["outputs"]) != 1:
                        failure = f"{name}: {answer.text[:200]}"
                except httpx.HTTPError as exc:
                    failure = f"{name}: {exc!r}"
                cold.add(time.perf_counter() - started, failure)

    threads = [threading.Thread(target=call_hot) for _ in range(hot_callers)]
    threads += [threading.Thread(target=call_cold, args=(seed,)) for seed in range(cold_callers)]
    busy_before, total_before = busy_share()
    for thread in threads:
        thread.start()
    stop.wait(seconds)
    stop.set()
    for thread in threads:
        thread.join(timeout=120)
    busy_after, total_after = busy_share()
    return {
        "hot": hot.summary(seconds) if hot_callers else None,
        "cold": cold.summary(seconds) if cold_callers else None,
        "machine_busy": round((busy_after - busy_before) / max(1, total_after - total_before), 3),
    }


def warm_up(address: str, hot_iterations: int) -> None:
    """One ``hot`` request to its answer: the model loaded before a phase is timed."""
    run_phase(address, [], 1, 0, 2.0, hot_iterations)


def measure(settings: argparse.Namespace) -> dict[str, Any]:
    """Both deployments, every phase; the document written with ``--json``."""
    hot_iterations = settings.hot_iterations
    with tempfile.TemporaryDirectory(prefix="corral-ray-hot-") as work:
        repository = Path(work) / "models"
        names = [path.parent.parent.name for path in build_repository(repository, settings.models)]
        add_model(repository, "hot", build_slow_loop(), toml="max_batch_size = 0\n")
        phases: dict[str, Any] = {}
        print("one replica ...", file=sys.stderr)
        with deployment(repository, 1, settings, Path(work) / "one.log") as address:
            warm_up(address, hot_iterations)
            phases["one replica, hot"] = run_phase(
                address, names, settings.hot_callers, 0, settings.seconds, hot_iterations
            )
        print(f"{settings.replicas} replicas ...", file=sys.stderr)
        with deployment(repository, settings.replicas, settings, Path(work) / "n.log") as address:
            warm_up(address, hot_iterations)
            phases["replicas, hot alone"] = run_phase(
                address, names, settings.hot_callers, 0, settings.seconds, hot_iterations
            )
            # Every cold model asked once, so that the timed phases find them on their replicas.
            run_phase(address, names, 0, settings.cold_callers, settings.seconds / 2, 0)
            phases["replicas, cold alone"] = run_phase(
                address, names, 0, settings.cold_callers, settings.seconds, hot_iterations
            )
            phases["replicas, hot with cold"] = run_phase(
                address,
                names,
                settings.hot_callers,
                settings.cold_callers,
                settings.seconds,
                hot_iterations,
            )
    one = phases["one replica, hot"]["hot"]["per_s"]
    both = phases["replicas, hot with cold"]
    alone = phases["replicas, cold alone"]["cold"]["p99_ms"]
    return {
        "machine": {"cores": os.cpu_count(), "python": platform.python_version()},
        "settings": {
            key: getattr(settings, key)
            for key in (
                "models",
                "replicas",
                "replica_cpus",
                "hot_iterations",
                "hot_callers",
                "cold_callers",
                "seconds",
                "hot_model_in_flight",
            )
        },
        "phases": phases,
        "hot_throughput_over_one_replica": round(both["hot"]["per_s"] / one, 2) if one else None,
        "goal_hot": f">= {0.8 * settings.replicas:.1f}",
        "cold_p99_over_alone": (
            round(both["cold"]["p99_ms"] / alone, 2) if alone and both["cold"]["p99_ms"] else None
        ),
        "goal_cold": "<= 1.5",
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; print the figures (and write them to ``--json``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", type=int, default=1000)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--replica-cpus", type=float, default=0.5)
    parser.add_argument("--hot-iterations", type=int, default=25_000)
    parser.add_argument("--hot-callers", type=int, default=16)
    parser.add_argument("--cold-callers", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--hot-model-in-flight", type=int, default=8)
    parser.add_argument("--json", type=Path)
    settings = parser.parse_args(argv)
    document = measure(settings)
    text = json.dumps(document, indent=1)
    print(text)
    if settings.json is not None:
        settings.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
