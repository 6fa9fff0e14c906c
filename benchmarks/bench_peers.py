"""corral against the model servers a user would otherwise run, in one interleaved run.

``make bench`` runs this. Every peer (``benchmarks/peers/``) serves the same repository of tiny
models (trees, linear models and MLPs, input ``X`` float32 [1, 4]) over v2 HTTP on 127.0.0.1;
each is started, timed until every model answers, measured for memory and threads, then driven
by the same client (wrk with ``peers.lua``) with the same body, requests spread over the models
uniformly and Zipf-skewed, at several concurrencies, round by round with the peers in turn.
Every peer is stopped by its own process id at the end. A peer that cannot be set up here is
reported as skipped, with the reason.

The client shares the machine with the servers, and the peers idle side by side while one is
measured: only ratios within one run compare.

Example::

    python benchmarks/bench_peers.py --quick --peers corral,fastapi
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil

HERE = Path(__file__).resolve().parent
# Run as a script (`python benchmarks/bench_peers.py`): the peers import as benchmarks.peers.
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

from benchmarks import http_bench, server_processes  # noqa: E402
from benchmarks.peers import CACHE, Peer, PeerUnavailable, Started  # noqa: E402
from benchmarks.peers.local import CorralPeer, CorralRayPeer, FastAPIPeer  # noqa: E402

LUA_SCRIPT = HERE / "peers.lua"
RESULTS = HERE / "results"
_READY_TIMEOUT_S = 900.0


def all_peers() -> dict[str, Peer]:
    """Every peer this benchmark knows, by name; the ones in their own venvs imported lazily."""
    peers: dict[str, Peer] = {
        "corral": CorralPeer(),
        "corral-ray": CorralRayPeer(),
        "fastapi": FastAPIPeer(),
    }
    for module, cls in (
        ("benchmarks.peers.mlserver", "MLServerPeer"),
        ("benchmarks.peers.triton", "TritonPeer"),
        ("benchmarks.peers.ray_serve", "RayServePeer"),
    ):
        with contextlib.suppress(ImportError, AttributeError):
            peer = getattr(__import__(module, fromlist=[cls]), cls)()
            peers[peer.name] = peer
    return peers


@dataclass
class Settings:
    """One run's shape."""

    models: int
    peers: list[str]
    concurrencies: list[int]
    distributions: list[str]
    rounds: int
    duration_s: float
    threads: int = 2


@dataclass
class Running:
    """A started peer and what was measured of it before the load."""

    peer: Peer
    started: Started
    seconds_to_all_models: float
    rss_bytes: int
    threads: int
    runs: list[dict[str, Any]] = field(default_factory=list)


def build_repository(root: Path, count: int) -> list[str]:
    """``count`` tiny models in Triton's layout (corral's demo models); returns their names."""
    from benchmarks.footprint import build_repository as build

    paths = build(root, count)
    return [path.parent.parent.name for path in paths]


def tree_usage(pid: int) -> tuple[int, int]:
    """Resident bytes and OS threads of a process and all its descendants."""
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0, 0
    rss = threads = 0
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            rss += process.memory_info().rss
            threads += process.num_threads()
    return rss, threads


def wait_ready(peer: Peer, started: Started, timeout: float = _READY_TIMEOUT_S) -> None:
    """Poll the peer's readiness path until 200; fail if it exits or times out."""
    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=started.url, timeout=5) as client:
        while True:
            if started.process.poll() is not None:
                raise http_bench.BenchmarkError(
                    f"{peer.name} exited with {started.process.returncode}:\n"
                    f"{started.log.read_text(errors='replace')[-2000:]}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if client.get(peer.ready_path()).status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise http_bench.BenchmarkError(f"{peer.name} not ready after {timeout:.0f} s")
            time.sleep(0.1)


def ask_every_model(peer: Peer, started: Started, names: Sequence[str], body: bytes) -> None:
    """One request per model, checked to be a 200 with an output ``Y`` (loads lazy peers)."""
    with httpx.Client(base_url=started.url, timeout=120) as client:
        for name in names:
            response = client.post(
                peer.infer_path(name), content=body, headers={"content-type": "application/json"}
            )
            if response.status_code != 200 or b'"Y"' not in response.content:
                raise http_bench.BenchmarkError(
                    f"{peer.name} answered {response.status_code} for {name}: "
                    f"{response.content[:300]!r}"
                )


def stop_peer(started: Started) -> None:
    """SIGTERM by pid (SIGKILL after 40 s), then SIGKILL whatever is left of its group.

    Every peer starts in a session of its own, so its process group id is its pid: helper
    processes that outlive an unorderly stop (Ray's agents, Triton's backend stubs) go too.
    """
    server_processes.stop_process(started.process, timeout=40)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(started.process.pid, signal.SIGKILL)


def start_peer(
    peer: Peer, repository: Path, names: Sequence[str], body: bytes, work: Path
) -> Running:
    """Start ``peer`` and time it until every model has answered once."""
    workdir = work / peer.name
    workdir.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    started = peer.start(repository, http_bench.free_port(), workdir)
    try:
        wait_ready(peer, started)
        ask_every_model(peer, started, names, body)
    except BaseException:
        stop_peer(started)
        raise
    seconds = time.monotonic() - began
    rss, threads = tree_usage(started.process.pid)
    return Running(peer, started, seconds, rss, threads)


def load_once(
    running: Running,
    settings: Settings,
    distribution: str,
    connections: int,
    body_file: Path,
    names_file: Path,
) -> dict[str, Any]:
    """One wrk run against one peer; its figures."""
    command = [
        http_bench.wrk_path(),
        f"-t{min(settings.threads, connections)}",
        f"-c{connections}",
        f"-d{max(1, round(settings.duration_s))}s",
        "--latency",
        "-s",
        str(LUA_SCRIPT),
        running.started.url,
        "--",
        str(body_file),
        str(names_file),
        distribution,
        running.peer.infer_path("%s"),
    ]
    figures = http_bench.run_load(command, settings.duration_s)
    failed = sum(figures["errors"].values())
    seconds = figures["duration_us"] / 1e6
    return {
        "distribution": distribution,
        "connections": connections,
        "requests_per_s": figures["requests"] / seconds if seconds else 0.0,
        "errors": failed,
        "p50_ms": figures["latency_us"]["p50"] / 1000,
        "p99_ms": figures["latency_us"]["p99"] / 1000,
    }


@contextlib.contextmanager
def running_peers(
    settings: Settings, repository: Path, names: Sequence[str], body: bytes, work: Path
) -> Iterator[tuple[list[Running], dict[str, str]]]:
    """Set up and start each peer in turn; yield the running ones and the skipped ones' reasons."""
    known = all_peers()
    running: list[Running] = []
    skipped: dict[str, str] = {}
    try:
        for name in settings.peers:
            peer = known.get(name)
            if peer is None:
                skipped[name] = "not available in this checkout (its peer module is missing)"
                continue
            try:
                print(f"setting up {name} ...", file=sys.stderr)
                peer.setup(CACHE)
                print(f"starting {name} on {len(names)} models ...", file=sys.stderr)
                running.append(start_peer(peer, repository, names, body, work))
            except PeerUnavailable as exc:
                skipped[name] = str(exc)
            except http_bench.BenchmarkError as exc:
                skipped[name] = f"failed to start: {exc}"
        yield running, skipped
    finally:
        for item in running:
            stop_peer(item.started)


def measure(settings: Settings) -> dict[str, Any]:
    """The whole run; returns the JSON document."""
    with tempfile.TemporaryDirectory(prefix="corral-bench-peers-") as scratch:
        work = Path(scratch)
        repository = work / "repository"
        names = build_repository(repository, settings.models)
        features = np.arange(4, dtype=np.float32).reshape(1, 4) / 4
        body = json.dumps(
            {
                "inputs": [
                    {
                        "name": "X",
                        "datatype": "FP32",
                        "shape": [1, 4],
                        "data": features.ravel().tolist(),
                    }
                ]
            }
        ).encode()
        body_file = work / "body.json"
        body_file.write_bytes(body)
        names_file = work / "models.txt"
        names_file.write_text("\n".join(names) + "\n")
        with running_peers(settings, repository, names, body, work) as (running, skipped):
            for round_index in range(settings.rounds):
                for distribution in settings.distributions:
                    for connections in settings.concurrencies:
                        order = (
                            running[round_index % max(1, len(running)) :]
                            + running[: round_index % max(1, len(running))]
                        )
                        for item in order:
                            figures = load_once(
                                item, settings, distribution, connections, body_file, names_file
                            )
                            figures["round"] = round_index
                            item.runs.append(figures)
                            print(
                                f"round {round_index + 1}/{settings.rounds} {item.peer.name} "
                                f"{distribution} c={connections}: "
                                f"{figures['requests_per_s']:,.0f} req/s",
                                file=sys.stderr,
                            )
            for item in running:
                item.rss_bytes, item.threads = max(
                    (item.rss_bytes, item.threads), tree_usage(item.started.process.pid)
                )
            peers = [
                {
                    "peer": item.peer.name,
                    "seconds_to_all_models": item.seconds_to_all_models,
                    "rss_bytes": item.rss_bytes,
                    "threads": item.threads,
                    "runs": item.runs,
                    "summary": summarize(item.runs),
                }
                for item in running
            ]
    known = all_peers()
    versions = {
        "corral": importlib.metadata.version("corral"),
        "onnxruntime (corral)": importlib.metadata.version("onnxruntime"),
        "wrk": http_bench.wrk_version(http_bench.wrk_path()),
    }
    for item in peers:
        pins = getattr(known[item["peer"]], "pins", None) or getattr(
            sys.modules.get(type(known[item["peer"]]).__module__), "PINS", None
        )
        if pins:
            versions[item["peer"]] = ", ".join(pins)
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "versions": versions,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "settings": vars(settings),
        "peers": peers,
        "skipped": skipped,
    }


def summarize(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Medians over rounds per (distribution, connections)."""
    cells: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for run in runs:
        cells.setdefault((run["distribution"], run["connections"]), []).append(run)
    return [
        {
            "distribution": distribution,
            "connections": connections,
            "requests_per_s": statistics.median(r["requests_per_s"] for r in cell),
            "p50_ms": statistics.median(r["p50_ms"] for r in cell),
            "p99_ms": statistics.median(r["p99_ms"] for r in cell),
            "errors": sum(r["errors"] for r in cell),
        }
        for (distribution, connections), cell in sorted(cells.items())
    ]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="50 models, 1 round, 2 s runs")
    parser.add_argument("--models", type=int, help="models in the repository (default 1000)")
    parser.add_argument(
        "--peers",
        default="corral,fastapi,mlserver,triton,ray-serve",
        help="peers, comma-separated (default: all)",
    )
    parser.add_argument("--concurrency", default="1,16,64", help="connections (default 1,16,64)")
    parser.add_argument("--rounds", type=int, help="rounds (default 3)")
    parser.add_argument("--duration", type=float, help="seconds per run (default 5)")
    parser.add_argument("--json", type=Path, help="where to write the results")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; write JSON under benchmarks/results/ (or --json)."""
    args = _parser().parse_args(argv)
    settings = Settings(
        models=args.models or (50 if args.quick else 1000),
        peers=[p for p in args.peers.split(",") if p],
        concurrencies=[int(c) for c in args.concurrency.split(",")],
        distributions=["uniform", "zipf"],
        rounds=args.rounds or (1 if args.quick else 3),
        duration_s=args.duration or (2.0 if args.quick else 5.0),
    )
    document = measure(settings)
    target = args.json or RESULTS / f"peers-{'quick' if args.quick else 'full'}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(document, indent=2) + "\n")
    for peer in document["peers"]:
        best = max((row["requests_per_s"] for row in peer["summary"]), default=0.0)
        print(
            f"{peer['peer']:>10}: all models answer after {peer['seconds_to_all_models']:.1f} s, "
            f"RSS {peer['rss_bytes'] / 2**20:,.0f} MiB, {peer['threads']} threads, "
            f"best {best:,.0f} req/s"
        )
    for name, reason in document["skipped"].items():
        print(f"{name:>10}: skipped: {reason}")
    print(f"results written to {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
