"""One large model at 1 intra-op thread against all cores: latency alone, and throughput busy.

The model is a published CNN: PP-OCRv4's text detector (4.7 MB, convolutions on a 1x3xHxW
image) as the ``rapidocr-onnxruntime`` wheel ships it, fetched with ``pip download --no-deps``
into ``--cache`` on first use and extracted from the wheel (or given with ``--model``).

onnxruntime's global pools are set once per process, so each configuration runs in a fresh
interpreter, in turns, round by round; each figure is the median of its rounds:

- ``latency``: one caller, one request at a time: milliseconds per run (p50);
- ``busy``: as many callers as cores, each sending its next request when the last returns,
  on as many compute workers: runs per second, and the process's CPU seconds per run (which
  shows threads spinning or waiting for each other).

Configurations: ``global:1`` (corral serve's default: every model on one global thread),
``global:N`` (``--intra-op-threads N``) and ``per_session:N`` (``--thread-pools per_session``
with the model's ``intra_op_threads = N``), N being the cores.

    python benchmarks/large_model_threads.py --rounds 3 --size 320
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path
from typing import Any

WHEEL = "rapidocr-onnxruntime==1.4.4"
MEMBER = "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx"


def fetch_model(cache: Path) -> Path:
    """The detector's .onnx file, downloaded and extracted into ``cache`` once."""
    target = cache / Path(MEMBER).name
    if target.is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", WHEEL, "--no-deps", "-q", "-d", folder],
            check=True,
        )
        (wheel,) = Path(folder).glob("*.whl")
        with zipfile.ZipFile(wheel) as archive:
            target.write_bytes(archive.read(MEMBER))
    return target


def child(mode: str, threads: int, model: str, size: int, runs: int, seconds: float) -> None:
    """Measure one configuration in this (fresh) process; print one JSON line."""
    import numpy as np

    import corral

    cores = os.cpu_count() or 1
    runtime = corral.Runtime(
        intra_op_threads=threads if mode == "global" else 1,
        compute_workers=cores,
        thread_pools=mode,  # type: ignore[arg-type]  # checked by the Runtime
    )
    session = corral.Session(
        model, runtime=runtime, intra_op_threads=threads if mode == "per_session" else None
    )
    feed = {"x": np.random.default_rng(0).random((1, 3, size, size), dtype=np.float32)}
    session.run(feed)  # first-run setup
    latencies = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(feed)
        latencies.append(time.perf_counter() - start)

    done = [0] * cores
    stop = threading.Event()

    def caller(index: int) -> None:
        while not stop.is_set():
            session.run(feed)
            done[index] += 1

    callers = [threading.Thread(target=caller, args=(i,)) for i in range(cores)]
    cpu_before, wall_before = time.process_time(), time.perf_counter()
    for thread in callers:
        thread.start()
    stop.wait(seconds)
    stop.set()
    for thread in callers:
        thread.join()
    wall, cpu = time.perf_counter() - wall_before, time.process_time() - cpu_before
    total = sum(done)
    print(
        json.dumps(
            {
                "latency_ms": statistics.median(latencies) * 1000,
                "busy_runs_per_s": total / wall,
                "busy_cpu_s_per_run": cpu / max(total, 1),
            }
        )
    )
    session.close()
    runtime.shutdown()


def main(argv: list[str] | None = None) -> int:
    """Run every configuration ``--rounds`` times and print the medians."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="an .onnx file taking x: 1x3xHxW (default: the detector)")
    parser.add_argument(
        "--cache", default=".cache/large-model", help="where the wheel's model is kept"
    )
    parser.add_argument("--size", type=int, default=320, help="the image's height and width")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=10, help="runs timed one at a time, per round")
    parser.add_argument("--seconds", type=float, default=5.0, help="busy time per round")
    parser.add_argument("--json", help="write the figures to this file too")
    parser.add_argument("--child", nargs=2, metavar=("MODE", "THREADS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    model = args.model or str(fetch_model(Path(args.cache)))
    if args.child:
        child(args.child[0], int(args.child[1]), model, args.size, args.runs, args.seconds)
        return 0
    cores = os.cpu_count() or 1
    configurations = [("global", 1), ("global", cores), ("per_session", cores)]
    results: dict[str, list[dict[str, float]]] = {f"{m}:{t}": [] for m, t in configurations}
    for round_ in range(args.rounds):
        for mode, threads in configurations:
            command = [sys.executable, __file__, "--model", model, "--size", str(args.size)]
            command += ["--runs", str(args.runs), "--seconds", str(args.seconds)]
            output = subprocess.run(
                [*command, "--child", mode, str(threads)],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            results[f"{mode}:{threads}"].append(json.loads(output.splitlines()[-1]))
            print(f"round {round_ + 1}: {mode}:{threads} done", file=sys.stderr)
    summary: dict[str, Any] = {
        "model": Path(model).name,
        "input": [1, 3, args.size, args.size],
        "cores": cores,
        "rounds": args.rounds,
        "results": {
            name: {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
            for name, rounds in results.items()
        },
    }
    print(f"{'threads':<16}{'latency ms (p50)':>18}{'busy runs/s':>14}{'CPU s per run':>15}")
    for name, figures in summary["results"].items():
        print(
            f"{name:<16}{figures['latency_ms']:>18.1f}{figures['busy_runs_per_s']:>14.2f}"
            f"{figures['busy_cpu_s_per_run']:>15.3f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
