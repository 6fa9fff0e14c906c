"""Object-store libraries side by side: listing 10,000 prefixes and fetching 1,000 small objects.

Starts moto's S3 server on 127.0.0.1 (the dev extra has it), puts ``--models`` tiny objects
under one prefix each (``models/m<i>/1/model.onnx``), then, cold (a new client each round),
through fsspec with s3fs and through obstore:

- lists the ``--models`` model prefixes under ``models/`` (paginated by the library);
- fetches ``--fetch`` of the objects one after another (what one model version's fetch does);
- fetches the same objects concurrently (the library's own batching).

Reports the median over ``--rounds`` rounds of each, in seconds. The dev extra has moto and
obstore; s3fs is installed by hand (``pip install s3fs``). From a checkout::

    python benchmarks/store_bench.py [--models 10000] [--fetch 1000] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from tests import s3server  # noqa: E402

BUCKET = "bench"


def _fill(server: s3server.S3Server, models: int) -> None:
    client = s3server.client(server)
    client.create_bucket(Bucket=BUCKET)

    def put(index: int) -> None:
        client.put_object(Bucket=BUCKET, Key=f"models/m{index}/1/model.onnx", Body=b"x" * 64)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, range(models)))


def _fsspec(server: s3server.S3Server, fetch: int) -> dict[str, float]:
    import s3fs

    def fs() -> s3fs.S3FileSystem:
        return s3fs.S3FileSystem(
            key=s3server.KEY_ID,
            secret=s3server.SECRET,
            endpoint_url=server.endpoint,
            skip_instance_cache=True,
            use_listings_cache=False,
        )

    started = time.perf_counter()
    names = fs().ls(f"{BUCKET}/models/", detail=False)
    listed = time.perf_counter() - started
    paths = [f"{name}/1/model.onnx" for name in sorted(names)[:fetch]]
    one = fs()
    started = time.perf_counter()
    for path in paths:
        one.cat_file(path)
    serial = time.perf_counter() - started
    started = time.perf_counter()
    fs().cat(paths)
    batch = time.perf_counter() - started
    return {"list": listed, "listed": len(names), "fetch": serial, "fetch_concurrent": batch}


def _obstore(server: s3server.S3Server, fetch: int) -> dict[str, float]:
    import obstore
    from obstore.store import S3Store

    def store() -> S3Store:
        return S3Store(
            BUCKET,
            endpoint=server.endpoint,
            access_key_id=s3server.KEY_ID,
            secret_access_key=s3server.SECRET,
            region="us-east-1",
            client_options={"allow_http": True},
        )

    started = time.perf_counter()
    found = obstore.list_with_delimiter(store(), "models/")
    listed = time.perf_counter() - started
    prefixes = sorted(found["common_prefixes"])
    paths = [f"{prefix.rstrip('/')}/1/model.onnx" for prefix in prefixes[:fetch]]
    one = store()
    started = time.perf_counter()
    for path in paths:
        obstore.get(one, path).bytes()
    serial = time.perf_counter() - started

    async def gather(target: S3Store) -> None:
        async def get(path: str) -> None:
            await (await obstore.get_async(target, path)).bytes_async()

        await asyncio.gather(*(get(path) for path in paths))

    started = time.perf_counter()
    asyncio.run(gather(store()))
    batch = time.perf_counter() - started
    return {"list": listed, "listed": len(prefixes), "fetch": serial, "fetch_concurrent": batch}


def main() -> int:
    """Run the comparison and print its table (or JSON)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=10_000)
    parser.add_argument("--fetch", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    libraries: dict[str, Callable[[s3server.S3Server, int], dict[str, float]]] = {
        "fsspec+s3fs": _fsspec,
        "obstore": _obstore,
    }
    rounds: dict[str, list[dict[str, float]]] = {name: [] for name in libraries}
    with tempfile.TemporaryDirectory() as folder, s3server.running(Path(folder) / "moto.log") as s3:
        started = time.perf_counter()
        _fill(s3, args.models)
        print(
            f"put {args.models} objects in {time.perf_counter() - started:.1f} s", file=sys.stderr
        )
        for index in range(args.rounds):
            # Alternate which goes first, so that neither always meets a warmer server.
            order = list(libraries) if index % 2 == 0 else list(reversed(libraries))
            for name in order:
                rounds[name].append(libraries[name](s3, args.fetch))
    result = {
        name: {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        for name, runs in rounds.items()
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{'library':14} {'list (s)':>9} {'fetch 1 by 1 (s)':>17} {'fetch concurrent (s)':>21}")
    for name, row in result.items():
        print(
            f"{name:14} {row['list']:9.2f} {row['fetch']:17.2f} {row['fetch_concurrent']:21.2f}"
            f"   ({int(row['listed'])} prefixes)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
