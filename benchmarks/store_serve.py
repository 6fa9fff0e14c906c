"""corral serve on 10,000 models in object storage beside the same models on local disk.

Puts ``--models`` tiny models (``m<i>/1/model.onnx``) in a local folder and in a bucket of
moto's S3 server on 127.0.0.1, then starts ``corral serve`` three times and measures:

- start-up: from the process's start to its "serving" line;
- first answers: ``--asked`` models, each asked once in turn (a load each, and for the store
  a fetch each), latency of each request;
- the same after a restart: local disk again; the store with the cache the first run filled
  (a listing per model, no GET).

From a checkout::

    python benchmarks/store_serve.py [--models 10000] [--asked 50] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import httpx  # noqa: E402

from corral.testing import build_linear  # noqa: E402
from tests import s3server  # noqa: E402
from tests.processes import start_server, stop_server  # noqa: E402

BODY = {"inputs": [{"name": "X", "shape": [1, 4], "datatype": "FP32", "data": [1.0] * 4}]}


def _run(repository: str, folder: Path, label: str, asked: int, *flags: str) -> dict[str, float]:
    started = time.perf_counter()
    served = start_server(repository, folder / f"{label}.log", *flags)  # type: ignore[arg-type]
    startup = time.perf_counter() - started
    latencies = []
    try:
        with httpx.Client(timeout=120) as client:
            for index in range(asked):
                began = time.perf_counter()
                answer = client.post(f"http://{served.http}/v2/models/m{index}/infer", json=BODY)
                latencies.append(time.perf_counter() - began)
                answer.raise_for_status()
            began = time.perf_counter()
            for index in range(asked):
                client.post(f"http://{served.http}/v2/models/m{index}/infer", json=BODY)
            loaded = (time.perf_counter() - began) / asked
    finally:
        stop_server(served)
    latencies.sort()
    return {
        "startup_s": startup,
        "first_answer_p50_ms": statistics.median(latencies) * 1000,
        "first_answer_p90_ms": latencies[int(len(latencies) * 0.9)] * 1000,
        "loaded_answer_ms": loaded * 1000,
    }


def main() -> int:
    """Fill both repositories, serve each, print the table (or JSON)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=10_000)
    parser.add_argument("--asked", type=int, default=50)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    model = build_linear()
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as temporary:
        folder = Path(temporary)
        local = folder / "models"
        for index in range(args.models):
            (local / f"m{index}" / "1").mkdir(parents=True)
            (local / f"m{index}" / "1" / "model.onnx").write_bytes(model)
        with s3server.running(folder / "moto.log") as s3:
            client = s3server.client(s3)
            client.create_bucket(Bucket="bench")

            def put(index: int) -> None:
                client.put_object(Bucket="bench", Key=f"repo/m{index}/1/model.onnx", Body=model)

            with ThreadPoolExecutor(8) as pool:
                list(pool.map(put, range(args.models)))
            os.environ.update(s3.environment())
            cache = ("--cache-dir", str(folder / "cache"))
            url = "s3://bench/repo"
            results["local disk"] = _run(str(local), folder, "local", args.asked)
            results["s3, empty cache"] = _run(url, folder, "cold", args.asked, *cache)
            results["local disk, again"] = _run(str(local), folder, "local2", args.asked)
            results["s3, cache of the run before"] = _run(url, folder, "warm", args.asked, *cache)
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"{'':30} {'start-up s':>10} {'first p50 ms':>13} {'first p90 ms':>13} {'loaded ms':>10}")
    for label, row in results.items():
        print(
            f"{label:30} {row['startup_s']:10.2f} {row['first_answer_p50_ms']:13.1f} "
            f"{row['first_answer_p90_ms']:13.1f} {row['loaded_answer_ms']:10.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
