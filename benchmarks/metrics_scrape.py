"""The cost of one ``/metrics`` scrape with 10,000 model versions counted: bytes and time.

Gives each of ``--versions`` model versions the figures a loaded version has: its run
counters (made as the loader makes them for every copy it builds) and one request counted
through the Host's own ``count_request`` (the path the servers take), so that every version
has a row in Triton's per-model families and the first ``--histograms`` have a latency
histogram of their own. Then renders the page ``--rounds`` times, as ``GET /metrics`` does
(on a worker thread, here on the main one), and reports its size and the median, minimum and
maximum render time. With ``--histograms-sweep`` it builds one Host per number of per-model
histograms and renders them in turn within each round, so that a load on the machine that
comes and goes falls on each alike.

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
from contextlib import ExitStack

import corral
from corral.protocol import DataPlane
from corral.server.observe.metrics import Metrics


def counted_host(stack: ExitStack, versions: int, histograms: int) -> Metrics:
    """A Host whose ``versions`` model versions each have run counters and one request."""
    folder = stack.enter_context(tempfile.TemporaryDirectory())
    host = stack.enter_context(corral.Host(folder, model_latency_histograms=histograms))
    for i in range(versions):
        name, version = f"model-{i:05d}", 1 + i % 3
        # What the loader does for each version it builds (a private call: no model loads).
        host._counters.run_counters((name, version))
        # Durations spread over the buckets, as real traffic's would be.
        host.count_request(name, version, 100_000 * (1 + i % 997), ok=True)
    return Metrics(DataPlane(host))


def main() -> None:
    """Measure and print one line per number of per-model histograms."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--versions", type=int, default=10_000)
    parser.add_argument("--histograms", type=int, default=100)
    parser.add_argument("--histograms-sweep", default="", help="e.g. 0,100,1000,10000")
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    sweep = [int(n) for n in args.histograms_sweep.split(",") if n] or [args.histograms]
    with ExitStack() as stack:
        pages = {n: counted_host(stack, args.versions, n) for n in sweep}
        times: dict[int, list[float]] = {n: [] for n in sweep}
        sizes: dict[int, int] = {}
        for _ in range(args.rounds):
            for n, metrics in pages.items():
                started = time.perf_counter()
                body, _ = metrics.render()
                times[n].append(time.perf_counter() - started)
                sizes[n] = len(body)
    print("| versions | per-model histograms | bytes | render median | min | max |")
    print("|---|---|---|---|---|---|")
    for n in sweep:
        print(
            f"| {args.versions:,} | {n:,} | {sizes[n]:,} | "
            f"{statistics.median(times[n]) * 1000:.0f} ms | {min(times[n]) * 1000:.0f} ms | "
            f"{max(times[n]) * 1000:.0f} ms |"
        )


if __name__ == "__main__":
    main()
