"""A tiny model's latency while a heavy one saturates the compute workers, in-process.

The scheduler keeps one compute worker from long runs while short models have requests
(``docs/scheduler.md``, "Short runs are not queued behind long ones"). This measures what
that buys and what it costs, on one Host with two compute workers and one intra-op thread
each, without HTTP (whose event loop would add its own waits):

- a tiny model (a depth-3 tree) asked once every ``--gap-ms``, alone, then while eight
  asyncio tasks keep a heavy model (an MLP on ``--heavy-rows`` rows, ~10 ms a run) busy;
- with the scheduler as it is (``lane``), and with the short lane switched off (``no-lane``:
  :data:`corral._compute.scheduler.SHORT_RECENT_S` set to 0, so long runs take every worker), in
  alternating rounds, side by side.

It prints, per mode and round, the tiny model's p50/p99 alone and loaded, and the heavy
model's runs per second while loaded::

    python benchmarks/short_lane.py [--rounds 2] [--tiny 400] [--heavy-rows 512]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import numpy as np

import corral
from corral import Host
from corral._compute import scheduler as scheduler_module
from corral.testing import build_mlp, build_tree


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


async def _tiny_latencies(host: Host, count: int, gap_s: float) -> list[float]:
    """Milliseconds of ``count`` tiny requests, one at a time, ``gap_s`` apart."""
    x = np.ones((1, 4), np.float32)
    latencies = []
    for _ in range(count):
        started = time.perf_counter()
        await host.infer_async("tiny", {"X": x})
        latencies.append((time.perf_counter() - started) * 1e3)
        await asyncio.sleep(gap_s)
    return latencies


async def _round(host: Host, tiny: int, gap_s: float, heavy_x: np.ndarray) -> dict[str, float]:
    alone = await _tiny_latencies(host, tiny // 2, gap_s)
    stop = asyncio.Event()
    runs = 0

    async def heavy() -> None:
        nonlocal runs
        while not stop.is_set():
            await host.infer_async("heavy", {"X": heavy_x})
            runs += 1

    workers = [asyncio.create_task(heavy()) for _ in range(8)]
    await asyncio.sleep(0.3)  # the heavy model's queue fills and its runs are measured
    counted, started = runs, time.perf_counter()
    loaded = await _tiny_latencies(host, tiny, gap_s)
    heavy_per_s = (runs - counted) / (time.perf_counter() - started)
    stop.set()
    await asyncio.gather(*workers)
    return {
        "alone_p50": _percentile(alone, 0.5),
        "alone_p99": _percentile(alone, 0.99),
        "loaded_p50": _percentile(loaded, 0.5),
        "loaded_p99": _percentile(loaded, 0.99),
        "heavy_runs_per_s": heavy_per_s,
    }


def main(argv: list[str] | None = None) -> int:
    """Measure both modes in alternating rounds and print the table; the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tiny", type=int, default=400, help="tiny requests while loaded")
    parser.add_argument("--gap-ms", type=float, default=5.0)
    parser.add_argument("--heavy-rows", type=int, default=512)
    args = parser.parse_args(argv)
    lane_on = scheduler_module.SHORT_RECENT_S
    with tempfile.TemporaryDirectory() as repository:
        for name, model in (("heavy", build_mlp(256, hidden=2048, n_outputs=8)), ("tiny", None)):
            folder = Path(repository, name, "1")
            folder.mkdir(parents=True)
            folder.joinpath("model.onnx").write_bytes(model or build_tree())
        Path(repository, "heavy", "model.toml").write_text("max_batch_size = 0\n")
        heavy_x = np.random.default_rng(0).standard_normal((args.heavy_rows, 256))
        heavy_x = heavy_x.astype(np.float32)
        runtime = corral.Runtime(compute_workers=2, intra_op_threads=1)
        print(
            f"{'mode':8} {'round':>5} {'alone p50/p99 ms':>17} {'loaded p50/p99 ms':>18} "
            f"{'heavy runs/s':>13}"
        )
        with Host(repository, runtime=runtime) as host:
            host.load("heavy")
            host.load("tiny")
            try:
                for round_ in range(1, args.rounds + 1):
                    for mode, recent_s in (("lane", lane_on), ("no-lane", 0.0)):
                        scheduler_module.SHORT_RECENT_S = recent_s
                        figures = asyncio.run(_round(host, args.tiny, args.gap_ms / 1e3, heavy_x))
                        print(
                            f"{mode:8} {round_:>5} "
                            f"{figures['alone_p50']:>8.2f}/{figures['alone_p99']:<8.2f} "
                            f"{figures['loaded_p50']:>9.2f}/{figures['loaded_p99']:<8.2f} "
                            f"{figures['heavy_runs_per_s']:>13.1f}"
                        )
            finally:
                scheduler_module.SHORT_RECENT_S = lane_on
        runtime.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
