"""One ``corral serve`` process against N behind one port (SO_REUSEPORT), side by side.

What ``docs/scaling.md`` measures: when one event loop cannot feed a machine's cores, do
several processes sharing the port pay? ``corral serve`` has no option for it, so each
process here is started by a small launcher (:data:`_LAUNCHER`) that makes uvicorn bind its
HTTP socket with ``SO_REUSEPORT``: every process has its own listening socket on the same
port, and the kernel spreads new connections over them by a hash of the connection.

Groups of processes run at once, each group on its own port, each named
``PROCESSESxWORKERS`` (``--groups``; by default ``1x<cores>``, one process with a compute
worker per core, against ``2x<cores/2>``, two processes splitting the cores between their
compute workers, as a ``--workers N`` option would split them; ``1x1`` or ``1x4`` measure
more compute workers in one process). For each model, each round loads every group with the
same wrk request one after the other (the order rotates by round), so that the machine's
other work falls on all alike; the first group is the baseline of the ratios. Every
process's answer is first checked equal to onnxruntime's in-process answer. Server CPU is a
group's processes' user + system time (``/proc/PID/stat``) over the run, divided by its
requests; the spread of that CPU over a group's processes shows how evenly the kernel
balanced them. wrk's own CPU (``getrusage`` of this script's ended children) is given beside
it: server and client cores together say how much of the machine a run had.

Models: ``tiny`` (the 4-feature MLP of the issue, JSON body) and ``heavy`` (an MLP of 512
features and 2,048 hidden units, about 1M multiply-adds a row, binary body)::

    python benchmarks/reuseport.py [--groups 1x2,2x1,1x1] [--rounds 3] [--duration 5] [--json FILE]

Needs ``wrk`` and corral's server extra. gRPC is off (``--grpc-port -1``): the comparison
is the HTTP edge's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

from benchmarks import http_bench, server_processes  # noqa: E402  (after the path above)
from benchmarks.http_bench import BenchmarkError, Payload  # noqa: E402

# Runs `corral serve` (argv[2:]) with uvicorn's HTTP socket bound with SO_REUSEPORT on the
# port argv[1], and a second listening socket of its own on a free port, which it prints:
# the benchmark checks each process's answers there, where no other process can take the
# connection. Only the HTTP port's server is changed: the metrics port, if any, binds as usual.
_LAUNCHER = """
import socket, sys
import uvicorn.server
port = int(sys.argv.pop(1))
startup = uvicorn.server.Server.startup
async def shared_port_startup(self, sockets=None):
    if sockets is None and self.config.port == port:
        shared = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        shared.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        shared.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        shared.bind((self.config.host, port))
        own = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        own.bind((self.config.host, 0))
        sockets = [shared, own]
        await startup(self, sockets)
        print("CORRAL_REUSEPORT_BOUND", own.getsockname()[1], file=sys.stderr, flush=True)
    else:
        await startup(self, sockets)
uvicorn.server.Server.startup = shared_port_startup
from corral.cli.commands import main
sys.exit(main(sys.argv[1:]))
"""
_BOUND = re.compile(r"^CORRAL_REUSEPORT_BOUND (\d+)$", re.MULTILINE)

_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Model:
    """One model of the comparison: its repository name, its request and the expected answer."""

    name: str
    payload: Payload
    expected: dict[str, Any]


@dataclass(frozen=True)
class Group:
    """The processes that share one port."""

    name: str
    port: int
    pids: tuple[int, ...]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # Fields 14 and 15 of proc(5) (utime, stime) are at 11 and 12 after the name.
    return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S


def build_repository(root: Path) -> None:
    """Write the two models, each in its own folder, version 1."""
    from corral.testing import build_mlp

    for name, model in (
        ("tiny", build_mlp(4)),
        ("heavy", build_mlp(512, hidden=2048, n_outputs=8)),
    ):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.onnx").write_bytes(model)


def models(repository: Path) -> list[Model]:
    """The requests and onnxruntime's own answers to them."""
    found = []
    for name, features, encode in (
        ("tiny", 4, http_bench.json_payload),
        ("heavy", 512, http_bench.binary_payload),
    ):
        tensor = http_bench.make_features(1, features)
        expected = http_bench.reference_outputs(repository / name / "1" / "model.onnx", tensor)
        found.append(Model(name, encode(tensor), expected))
    return found


def free_reuseport_port() -> int:
    """A port free on 127.0.0.1 now, which SO_REUSEPORT sockets can then share."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def start_in_this_session(argv: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    """Start a server in this script's session (``start_process`` gives each its own).

    With the kernel's autogroup scheduling (``/proc/sys/kernel/sched_autogroup_enabled``,
    on by default), each session is one scheduling group with an equal share of the CPU
    against the others: a server in a session of its own would get a share apart from wrk's
    and the other group's, and N processes in N sessions N shares, which alone makes N look
    faster than one on a busy machine. Here wrk and every server share one group.
    """
    return server_processes.start_process(argv, log, own_session=False)


def wait_until_bound(
    process: Any, name: str, log: Path, timeout: float = http_bench._STARTUP_TIMEOUT_S
) -> int:
    """Wait until the launcher logged that ``process`` listens; its own port.

    Fails if the process exits first, or does not listen within ``timeout``.
    """
    deadline = time.monotonic() + timeout
    while (bound := _BOUND.search(log.read_text(errors="replace"))) is None:
        if process.poll() is not None:
            raise BenchmarkError(f"{name} exited with code {process.returncode} during startup")
        if time.monotonic() > deadline:
            raise BenchmarkError(f"{name} did not listen within {timeout:.0f} s")
        time.sleep(0.05)
    return int(bound.group(1))


@contextlib.contextmanager
def running_group(
    name: str, processes: int, workers: int, repository: Path, logs: Path, check: list[Model]
) -> Iterator[Group]:
    """``processes`` corral serve processes on one port, each with ``workers`` compute workers.

    Each is started once the one before it has bound the port (its launcher says so in its
    log), and every model's answer is checked on each process's own port, then on the
    shared port, on connections the kernel spreads over them.
    """
    port = free_reuseport_port()
    pids: list[int] = []
    with contextlib.ExitStack() as stack:
        for index in range(processes):
            argv = [sys.executable, "-c", _LAUNCHER, str(port), "serve", str(repository)]
            argv += ["--host", "127.0.0.1", "--http-port", str(port), "--grpc-port", "-1"]
            argv += ["--compute-workers", str(workers), "--log-level", "warning"]
            argv += ["--edge", "python"]  # the launcher binds uvicorn's socket: the Python edge
            log = logs / f"{name}-{index}.log"
            process = start_in_this_session(argv, log)
            stack.callback(http_bench._stop_and_report, f"{name}[{index}]", process, log)
            own_port = wait_until_bound(process, f"{name}[{index}]", log)
            for model in check:
                path = f"/v2/models/{model.name}/infer"
                answer = http_bench.http_post(own_port, path, model.payload, timeout=30.0)
                http_bench.check_answer(f"{name}[{index}] {model.name}", answer, model.expected)
            pids.append(process.pid)
        # Through the shared port, connections land on any of them.
        for model in check:
            for _ in range(4 * processes):
                answer = http_bench.http_post(port, f"/v2/models/{model.name}/infer", model.payload)
                http_bench.check_answer(f"{name} {model.name}", answer, model.expected)
        print(f"  {name}: port {port}, pids {pids}, every answer checked", file=sys.stderr)
        yield Group(name, port, tuple(pids))


def _children_cpu_seconds() -> float:
    """User + system CPU time of this process's children that have ended and been waited for."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def load(
    wrk: str, group: Group, model: Model, body_file: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """One wrk run against ``group``: its figures, and the server CPU each process spent."""
    url = f"http://127.0.0.1:{group.port}/v2/models/{model.name}/infer"
    command = http_bench.wrk_command(
        wrk,
        url,
        body_file,
        model.payload,
        connections=args.connections,
        threads=args.threads,
        duration_s=args.duration,
    )
    before = [cpu_seconds(pid) for pid in group.pids]
    client_before = _children_cpu_seconds()
    started = time.monotonic()
    figures = http_bench.run_load(command, args.duration)
    elapsed = time.monotonic() - started
    # wrk is the only child that ends meanwhile: the servers run on.
    client = _children_cpu_seconds() - client_before
    cpu = [cpu_seconds(pid) - was for pid, was in zip(group.pids, before, strict=True)]
    result = http_bench.run_result(f"{model.name} {group.name}", 0, figures)
    if result["socket_errors"] or result["status_errors"]:
        raise BenchmarkError(f"{model.name} on {group.name}: errors in {figures}")
    return {
        "requests_per_s": result["requests_per_s"],
        "p50_ms": result["latency_p50_ms"],
        "p99_ms": result["latency_p99_ms"],
        "server_cores": sum(cpu) / elapsed,
        "client_cores": client / elapsed,
        "cpu_us_per_request": 1e6 * sum(cpu) / max(1, result["requests"]),
        "cpu_share": [c / sum(cpu) if sum(cpu) else 0.0 for c in cpu],
    }


def report(runs: Sequence[dict[str, Any]], groups: Sequence[str], names: Sequence[str]) -> str:
    """The Markdown table: medians over rounds, and each round's ratio to the first group."""
    lines = [
        "| model | processes x workers | req/s (median) | p50 ms | p99 ms | server cores | "
        f"wrk cores | CPU µs/request | vs {groups[0]} (each round) | CPU share per process |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for model in names:
        for group in groups:
            mine = [r for r in runs if r["model"] == model and r["group"] == group]
            base = {r["round"]: r for r in runs if r["model"] == model and r["group"] == groups[0]}
            ratios = [r["requests_per_s"] / base[r["round"]]["requests_per_s"] for r in mine]

            def median(key: str, rows: list[dict[str, Any]] = mine) -> float:
                return statistics.median(r[key] for r in rows)

            shares = " / ".join(
                f"{statistics.median(r['cpu_share'][i] for r in mine):.2f}"
                for i in range(len(mine[0]["cpu_share"]))
            )
            lines.append(
                f"| {model} | {group} | {median('requests_per_s'):,.0f} | "
                f"{median('p50_ms'):.2f} | {median('p99_ms'):.2f} | "
                f"{median('server_cores'):.2f} | {median('client_cores'):.2f} | "
                f"{median('cpu_us_per_request'):.0f} | "
                f"{' '.join(f'{x:.2f}' for x in ratios)} | {shares} |"
            )
    return "\n".join(lines)


def parse_groups(text: str) -> list[tuple[int, int]]:
    """``"1x2,2x1"`` -> ``[(1, 2), (2, 1)]``: processes and compute workers per process.

    >>> parse_groups("1x2, 2x1")
    [(1, 2), (2, 1)]
    """
    groups = []
    for item in text.split(","):
        processes, _, workers = item.strip().partition("x")
        if not (processes.isdigit() and workers.isdigit()) or min(int(processes), int(workers)) < 1:
            raise ValueError(f"{item.strip()!r} is not PROCESSESxWORKERS, e.g. 2x1")
        groups.append((int(processes), int(workers)))
    if len(set(groups)) != len(groups) or len(groups) < 2:
        raise ValueError("give two groups or more, each once")
    return groups


def main(argv: Sequence[str] | None = None) -> int:
    """Run the comparison; print the table (and write the runs as JSON with ``--json``)."""
    cores = os.cpu_count() or 1
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--groups",
        default=f"1x{cores},2x{max(1, cores // 2)}",
        help="PROCESSESxWORKERS,... (the first is the baseline; default: %(default)s)",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per wrk run")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2, help="wrk's threads")
    parser.add_argument("--json", type=Path, help="write every run here")
    args = parser.parse_args(argv)
    try:
        spec = parse_groups(args.groups)
    except ValueError as exc:
        parser.error(str(exc))
    names = [f"{processes}x{workers}" for processes, workers in spec]
    wrk = http_bench.wrk_path()
    with tempfile.TemporaryDirectory(prefix="corral-reuseport-") as temp:
        root = Path(temp)
        repository = root / "models"
        build_repository(repository)
        check = models(repository)
        bodies = {}
        for model in check:
            bodies[model.name] = root / f"{model.name}.body"
            bodies[model.name].write_bytes(model.payload.body)
        print(f"load average before: {os.getloadavg()}", file=sys.stderr)
        runs: list[dict[str, Any]] = []
        with contextlib.ExitStack() as stack:
            groups = [
                stack.enter_context(
                    running_group(name, processes, workers, repository, root, check)
                )
                for name, (processes, workers) in zip(names, spec, strict=True)
            ]
            # Each process loads a model on its first request for it: a short run per model
            # and group first, not counted.
            warmup = argparse.Namespace(**{**vars(args), "duration": 2.0})
            for model in check:
                for target in groups:
                    load(wrk, target, model, bodies[model.name], warmup)
            for round_index in range(args.rounds):
                shift = round_index % len(groups)
                order = groups[shift:] + groups[:shift]
                for model in check:
                    for target in order:
                        figures = load(wrk, target, model, bodies[model.name], args)
                        figures.update(model=model.name, group=target.name, round=round_index)
                        runs.append(figures)
                        print(
                            f"  round {round_index} {model.name} {target.name}: "
                            f"{figures['requests_per_s']:,.0f} req/s",
                            file=sys.stderr,
                        )
        load_after = os.getloadavg()
    print(report(runs, names, [m.name for m in check]))
    print(
        f"\n{cores} cores; load average after: {load_after}; wrk -t{args.threads} "
        f"-c{args.connections}, {args.rounds} rounds of {args.duration:g} s"
    )
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
