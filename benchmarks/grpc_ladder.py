"""Where a gRPC ModelInfer's server CPU goes: grpc's floor, corral's edge, the hand-off, the run.

Starts, on 127.0.0.1, one server per step of the ladder and loads each with the same gRPC
client (``http_bench.py grpc-client``: a Python grpc.aio client, 16 calls in flight), every
step once per round, interleaved, so that other work on the machine falls on all alike:

- ``floor``: ``grpc_floor.py aio-uvloop``, a grpc.aio handler on uvloop answering fixed bytes;
- ``floor-sync``: ``grpc_floor.py sync``, grpc's threaded server (a pool of ``--workers``);
- ``edge``: ``grpc_floor.py corral-edge``, corral's gRPC server on a data plane that answers
  at once (request parsed and decoded, servicer, answer encoded);
- ``edge-handoff``: ``corral-edge-handoff``, the same after a no-op on a pool of two threads;
- ``corral``: ``corral serve`` of this checkout on the one-model repository (the 4-feature
  MLP unless ``--model``); ``--baseline DIR`` adds ``baseline``, ``corral serve`` run from
  another checkout (say a ``git worktree`` of main), for a before-and-after in one run.

Each run reads the server's CPU time from ``/proc`` before and after (every thread, and the
main thread alone) and prints, per step, the median over rounds of requests/s and of server
CPU µs per request::

    python benchmarks/grpc_ladder.py [--rounds 3] [--duration 5] [--baseline ../grpc-base]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

from benchmarks.http_bench import RESULT_MARKER, free_port, parse_result  # noqa: E402
from corral.testing import build_model  # noqa: E402

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_ticks(pid: int) -> tuple[int, int]:
    """The process's CPU ticks (user + system, every thread) and its main thread's."""

    def ticks(stat: str) -> int:
        fields = Path(stat).read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])

    return ticks(f"/proc/{pid}/stat"), ticks(f"/proc/{pid}/task/{pid}/stat")


def wait_ready(process: subprocess.Popen[str], port: int, timeout_s: float = 60.0) -> None:
    """Wait until ``port`` answers a TCP connection; raise if the server exits first."""
    import socket

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args} exited with {process.returncode}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{process.args} did not listen on {port} within {timeout_s:g} s")


def load(port: int, model: str, duration_s: float) -> dict[str, Any]:
    """One run of the gRPC client against ``port``; its figures."""
    command = [sys.executable, str(HERE / "http_bench.py"), "grpc-client", "--port", str(port)]
    command += ["--model", model, "--duration", str(duration_s)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=duration_s + 60)
    if done.returncode != 0 or RESULT_MARKER not in done.stdout:
        raise RuntimeError(f"the client failed: {done.stdout}{done.stderr}")
    return parse_result(done.stdout)


def main(argv: list[str] | None = None) -> int:
    """Run the ladder and print its table; the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--model", default="mlp", choices=("mlp", "tree"))
    parser.add_argument("--workers", type=int, default=2, help="floor-sync's pool")
    parser.add_argument("--baseline", type=Path, help="another checkout to run corral serve from")
    parser.add_argument("--json", type=Path, help="also write the runs here")
    args = parser.parse_args(argv)
    python = sys.executable
    floor = str(HERE / "grpc_floor.py")
    with tempfile.TemporaryDirectory(prefix="corral-grpc-ladder-") as scratch:
        repository = Path(scratch, "repository")
        model_file = repository / args.model / "1" / "model.onnx"
        model_file.parent.mkdir(parents=True)
        model_file.write_bytes(build_model(args.model))

        def serve(checkout: Path, port: int) -> tuple[list[str], dict[str, str]]:
            command = [python, "-m", "corral.cli", "serve", str(repository), "--host"]
            command += ["127.0.0.1", "--http-port", str(free_port()), "--grpc-port", str(port)]
            command += ["--log-level", "warning"]
            return command, {**os.environ, "PYTHONPATH": str(checkout)}

        here_env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
        steps: dict[str, tuple[list[str], dict[str, str], int]] = {}
        for name, mode in [
            ("floor", ["aio-uvloop"]),
            ("floor-sync", ["sync", "--workers", str(args.workers)]),
            ("edge", ["corral-edge"]),
            ("edge-handoff", ["corral-edge-handoff"]),
        ]:
            port = free_port()
            steps[name] = ([python, floor, mode[0], str(port), *mode[1:]], here_env, port)
        port = free_port()
        steps["corral"] = (*serve(HERE.parent, port), port)
        if args.baseline is not None:
            port = free_port()
            steps["baseline"] = (*serve(args.baseline.resolve(), port), port)
        processes: dict[str, subprocess.Popen[str]] = {}
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in steps}
        try:
            for name, (command, env, port) in steps.items():
                processes[name] = subprocess.Popen(
                    command,
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    text=True,
                    cwd=scratch,
                )
                wait_ready(processes[name], port)
                load(port, args.model, 1.0)  # warm up, and check that it answers
            for round_ in range(args.rounds):
                order = list(steps) if round_ % 2 == 0 else list(reversed(steps))
                for name in order:
                    pid, port = processes[name].pid, steps[name][2]
                    before = cpu_ticks(pid)
                    figures = load(port, args.model, args.duration)
                    after = cpu_ticks(pid)
                    requests = figures["requests"]
                    run = {
                        "requests_per_s": requests / (figures["duration_us"] / 1e6),
                        "cpu_us": (after[0] - before[0]) / _TICK / requests * 1e6,
                        "main_thread_cpu_us": (after[1] - before[1]) / _TICK / requests * 1e6,
                        "p99_ms": figures["latency_us"]["p99"] / 1000,
                    }
                    runs[name].append(run)
                    print(
                        f"round {round_ + 1}/{args.rounds} {name}: {run['requests_per_s']:,.0f} "
                        f"req/s, {run['cpu_us']:.0f} µs CPU/req "
                        f"(main thread {run['main_thread_cpu_us']:.0f})",
                        file=sys.stderr,
                    )
        finally:
            for process in processes.values():
                process.terminate()
            for process in processes.values():
                process.wait(timeout=30)
    print("| step | requests/s | server CPU µs/req | main thread µs/req | p99 ms |")
    print("|---|---:|---:|---:|---:|")
    for name, rows in runs.items():

        def median(key: str, rows: list[dict[str, float]] = rows) -> float:
            return statistics.median(row[key] for row in rows)

        print(
            f"| {name} | {median('requests_per_s'):,.0f} | {median('cpu_us'):.0f} | "
            f"{median('main_thread_cpu_us'):.0f} | {median('p99_ms'):.2f} |"
        )
    print(f"2 CPUs shared with the client; 1-minute load average {os.getloadavg()[0]:.2f}")
    if args.json is not None:
        args.json.write_text(json.dumps(runs, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
