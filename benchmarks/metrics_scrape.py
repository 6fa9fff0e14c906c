"""The cost of one ``/metrics`` scrape with 10,000 model versions counted: bytes and time.

Counts one request for each of ``--versions`` model versions through the Host's own
``count_request`` (the path the servers take), so that every version has a row in Triton's
per-model families and the first ``--histograms`` have a latency histogram of their own,
then renders the page ``--rounds`` times, as ``GET /metrics`` does (on a worker thread, here
on the main one), and reports its size and the median, minimum and maximum render time; with
``--histograms-sweep`` it does so for several numbers of per-model histograms.

From a checkout::

    python benchmarks/metrics_scrape.py [--versions 10000] [--histograms 100] [--rounds 20]
    python benchmarks/metrics_scrape.py --histograms-sweep 0,100,1000,10000

The figures are in docs/operations.md ("Metrics").
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import corral
from corral.protocol import DataPlane
from corral.server.metrics import Metrics


def measure(versions: int, histograms: int, rounds: int) -> tuple[int, list[float]]:
    """The page's size in bytes, and each render's seconds."""
    with (
        tempfile.TemporaryDirectory() as empty,
        corral.Host(empty, model_latency_histograms=histograms) as host,
    ):
        for i in range(versions):
            # Durations spread over the buckets, as real traffic's would be.
            host.count_request(f"model-{i:05d}", 1 + i % 3, 100_000 * (1 + i % 997), ok=True)
        metrics = Metrics(DataPlane(host))
        times = []
        size = 0
        for _ in range(rounds):
            started = time.perf_counter()
            body, _ = metrics.render()
            times.append(time.perf_counter() - started)
            size = len(body)
    return size, times


def main() -> None:
    """Measure and print one line per number of per-model histograms."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--versions", type=int, default=10_000)
    parser.add_argument("--histograms", type=int, default=100)
    parser.add_argument("--histograms-sweep", default="", help="e.g. 0,100,1000,10000")
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    sweep = [int(n) for n in args.histograms_sweep.split(",") if n] or [args.histograms]
    print("| versions | per-model histograms | bytes | render median | min | max |")
    print("|---|---|---|---|---|---|")
    for histograms in sweep:
        size, times = measure(args.versions, histograms, args.rounds)
        print(
            f"| {args.versions:,} | {histograms:,} | {size:,} | "
            f"{statistics.median(times) * 1000:.0f} ms | {min(times) * 1000:.0f} ms | "
            f"{max(times) * 1000:.0f} ms |"
        )


if __name__ == "__main__":
    main()
