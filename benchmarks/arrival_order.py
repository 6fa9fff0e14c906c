"""Waits of 16 callers of a one-session model, two checkouts side by side (issue 31, item 2).

A model served with ``concurrency = "pool:1"`` (a config.pbtxt's ``instance_group
{ count: 1 }``) or ``"exclusive"`` runs one request at a time. Before the scheduler bounded
a queue's workers by its sessions, a second compute worker took the next request and waited
for the session, and lost it to the first worker again and again: a few requests waited
seconds while the median waited milliseconds. This measures each request's wait (from the
call to its answer) at ``--callers`` concurrent callers, in process, for two checkouts of
corral: ``--before`` (a git ref, unpacked to a temporary folder) and this checkout. Each
side runs in its own process; rounds alternate between them (before, after, before, ...),
so both see the same machine.

From a checkout::

    python benchmarks/arrival_order.py --before 2720941 [--model mlp|magika]
        [--concurrency pool:1] [--batch 0|N|probe] [--workers 2] [--callers 16]
        [--caller async|thread] [--seconds 3] [--rounds 3] [--http]

``--http``: each side is a ``corral serve`` process (the checkout's compute workers, the
cores) loaded by wrk at ``--callers`` connections with a v2 JSON body; wrk's latencies.
``magika`` is the real CNN from its PyPI wheel (``benchmarks/real_models.py`` fetches it
into ~/.cache/corral-bench); ``mlp`` a 256-feature MLP built here (about 0.1 ms a run).
Prints one line per round and side, then the medians of the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

_HERE = Path(__file__).resolve().parent
_ROOT = _HERE.parent


def prepare(
    model: str, concurrency: str, batch: str, folder: Path, *, pbtxt: bool = False
) -> tuple[Path, Path]:
    """A repository with the model as ``m`` under ``concurrency``, and a request's feed.

    ``batch``: its model.toml's ``max_batch_size``, or ``probe`` for none (corral probes).
    ``pbtxt``: a Triton config.pbtxt instead (``instance_group { count: N }`` for pool:N).
    """
    version = folder / "repo" / "m" / "1"
    version.mkdir(parents=True)
    if model == "magika":
        sys.path.insert(0, str(_ROOT))
        from benchmarks import real_models

        paths, unpacked = real_models.fetch_models(["magika"])
        magika = real_models.MODELS["magika"]
        feed = magika.feeds(1, real_models.extra_files(unpacked, magika))
        path = paths["magika"]
        onnx = path.read_bytes()
    else:
        from corral.testing import build_mlp

        onnx = build_mlp(256, 2048, 8, seed=1)
        feed = {"X": np.ones((1, 256), np.float32)}
    (version / "model.onnx").write_bytes(onnx)
    if pbtxt:
        # Triton's layout, as the peer runs served it: count 1 is corral's pool:1.
        count = 1 if concurrency == "pool:1" else int(concurrency.removeprefix("pool:"))
        config = 'platform: "onnxruntime_onnx"\n'
        config += f"max_batch_size: {0 if batch == 'probe' else int(batch)}\n"
        config += f"instance_group [ {{ kind: KIND_CPU, count: {count} }} ]\n"
        (folder / "repo" / "m" / "config.pbtxt").write_text(config)
    else:
        toml = f'concurrency = "{concurrency}"\n'
        if batch != "probe":
            toml += f"max_batch_size = {int(batch)}\n"
        (folder / "repo" / "m" / "model.toml").write_text(toml)
    np.savez(folder / "feed.npz", **feed)
    return folder / "repo", folder / "feed.npz"


def unpack(ref: str, folder: Path) -> Path:
    """The ``corral`` package of git ``ref``, unpacked under ``folder``."""
    archive = subprocess.run(
        ["git", "-C", str(_ROOT), "archive", ref, "corral"], check=True, capture_output=True
    ).stdout
    target = folder / f"corral-{ref}"
    target.mkdir()
    archive_path = folder / "corral.tar"
    archive_path.write_bytes(archive)
    with tarfile.open(archive_path) as tar:
        tar.extractall(target, filter="data")
    return target


def measure(
    repo: Path, feed_file: Path, workers: int, callers: int, caller: str, seconds: float
) -> dict[str, Any]:
    """Each call's seconds from call to answer, at ``callers`` callers for ``seconds``."""
    import corral

    feed = dict(np.load(feed_file))
    waits: list[float] = []
    with (
        corral.Runtime(compute_workers=workers) as runtime,
        corral.Host(repo, runtime=runtime) as host,
    ):
        for _ in range(20):
            host.submit("m", feed).result(timeout=60)
        stop = time.monotonic() + seconds

        def thread_caller() -> None:
            mine = []
            while time.monotonic() < stop:
                started = time.perf_counter()
                host.submit("m", feed, timeout=60).result(timeout=60)
                mine.append(time.perf_counter() - started)
            waits.extend(mine)

        async def task_caller() -> None:
            while time.monotonic() < stop:
                started = time.perf_counter()
                await host.infer_async("m", feed, timeout=60)
                waits.append(time.perf_counter() - started)

        async def all_tasks() -> None:
            await asyncio.gather(*(task_caller() for _ in range(callers)))

        began = time.perf_counter()
        if caller == "async":
            asyncio.run(all_tasks())
        else:
            threads = [threading.Thread(target=thread_caller) for _ in range(callers)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        elapsed = time.perf_counter() - began
    waits.sort()
    count = len(waits)
    return {
        "requests_per_s": count / elapsed,
        "mean_ms": statistics.fmean(waits) * 1e3,
        "p50_ms": waits[count // 2] * 1e3,
        "p99_ms": waits[min(count - 1, int(count * 0.99))] * 1e3,
        "max_ms": waits[-1] * 1e3,
        "corral": corral.__file__,
    }


def _child(args: argparse.Namespace) -> int:
    result = measure(
        Path(args.repo), Path(args.feed), args.workers, args.callers, args.caller, args.seconds
    )
    print(json.dumps(result))
    return 0


def _side(path: Path, args: argparse.Namespace, repo: Path, feed: Path) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", "--repo", str(repo), "--feed", str(feed)]
    command += ["--workers", str(args.workers), "--callers", str(args.callers)]
    command += ["--caller", args.caller, "--seconds", str(args.seconds)]
    env = dict(os.environ, PYTHONPATH=str(path))
    done = subprocess.run(command, check=True, capture_output=True, text=True, env=env)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _http_side(path: Path, args: argparse.Namespace, repo: Path, feed: Path) -> dict[str, Any]:
    """``corral serve`` of ``path``'s corral on the repository, loaded by wrk over JSON."""
    sys.path.insert(0, str(_ROOT))
    from benchmarks import http_bench, real_models, server_processes

    work = Path(tempfile.mkdtemp(prefix="corral-arrival-http-"))
    body = work / "body.json"
    payload = real_models.json_payload(dict(np.load(feed)))
    body.write_bytes(payload.body)
    port = http_bench.free_port()
    argv = [
        sys.executable,
        "-c",
        "import sys; from corral.cli import main; sys.exit(main())",
    ]
    argv += ["serve", str(repo), "--host", "127.0.0.1", "--http-port", str(port)]
    argv += ["--grpc-port", "-1", "--log-level", "warning", "--load-model", "*"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env["PYTHONPATH"] = str(path)
    process = server_processes.start_process(argv, work / "server.log", env)
    try:
        _wait_ready(port, process)
        url = f"http://127.0.0.1:{port}/v2/models/m/infer"
        command = [http_bench.wrk_path(), "-t2", f"-c{args.callers}", f"-d{round(args.seconds)}s"]
        command += ["--timeout", "30s", "--latency", "-s", str(http_bench.LUA_SCRIPT), url]
        command += ["--", str(body), payload.content_type]
        figures = http_bench.run_load(command, args.seconds)
    finally:
        server_processes.stop_process(process)
    latency = figures["latency_us"]
    if sum(figures["errors"].values()):
        raise RuntimeError(f"wrk saw errors: {figures['errors']}")
    return {
        "requests_per_s": figures["requests"] / (figures["duration_us"] / 1e6),
        "mean_ms": latency["mean"] / 1e3,
        "p50_ms": latency["p50"] / 1e3,
        "p99_ms": latency["p99"] / 1e3,
        "max_ms": latency["max"] / 1e3,
    }


def _wait_ready(port: int, process: subprocess.Popen[bytes], limit_s: float = 60.0) -> None:
    """Until the server says it is ready (its model loaded); bounded."""
    import http.client

    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"corral serve exited with {process.returncode}")
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request("GET", "/v2/models/m/ready")
            if connection.getresponse().status == 200:
                return
        except OSError:
            pass
        threading.Event().wait(0.2)
    raise RuntimeError(f"corral serve was not ready within {limit_s:.0f} s")


def _line(side: str, result: dict[str, Any]) -> str:
    return (
        f"{side:<7} {result['requests_per_s']:8.0f} req/s  mean {result['mean_ms']:7.2f} ms  "
        f"p50 {result['p50_ms']:7.2f}  p99 {result['p99_ms']:8.2f}  max {result['max_ms']:8.1f}"
        f"  max/mean {result['max_ms'] / result['mean_ms']:6.1f}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the comparison; see the module's doc."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--before", default=None, help="git ref of the other side (none: this checkout only)")
    add("--model", choices=("mlp", "magika"), default="mlp")
    add("--concurrency", default="pool:1", help="the model's policy (pool:1)")
    add("--batch", default="0", help="max_batch_size, or probe: corral's probe decides (0)")
    add("--pbtxt", action="store_true", help="a config.pbtxt with instance_group (pool:N only)")
    add("--workers", type=int, default=2, help="compute workers (2)")
    add("--callers", type=int, default=16, help="concurrent callers (16)")
    add("--caller", choices=("async", "thread"), default="async", help="asyncio tasks or threads")
    add("--seconds", type=float, default=3.0, help="seconds per round and side (3)")
    add("--rounds", type=int, default=3, help="rounds (3)")
    add("--http", action="store_true", help="over HTTP: corral serve loaded by wrk (JSON)")
    add("--child", action="store_true", help=argparse.SUPPRESS)
    add("--repo", help=argparse.SUPPRESS)
    add("--feed", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return _child(args)
    with tempfile.TemporaryDirectory(prefix="corral-arrival-") as temporary:
        folder = Path(temporary)
        repo, feed = prepare(args.model, args.concurrency, args.batch, folder, pbtxt=args.pbtxt)
        sides = {"after": _ROOT}
        if args.before:
            sides = {"before": unpack(args.before, folder), **sides}
        print(
            f"{args.model}, {args.concurrency}, max_batch_size {args.batch}, "
            f"{args.workers} compute workers, "
            f"{args.callers} {'wrk connections' if args.http else args.caller + ' callers'}, "
            f"{args.seconds:g} s a round",
            flush=True,
        )
        results: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
        for round_index in range(args.rounds):
            for side, path in sides.items():
                measure_side = _http_side if args.http else _side
                result = measure_side(path, args, repo, feed)
                results[side].append(result)
                print(f"round {round_index + 1} " + _line(side, result), flush=True)
        print("medians of the rounds:")
        for side, rounds in results.items():
            keys = [key for key in rounds[0] if key != "corral"]
            median = {key: statistics.median(r[key] for r in rounds) for key in keys}
            print("        " + _line(side, median))
    return 0


if __name__ == "__main__":
    sys.exit(main())
