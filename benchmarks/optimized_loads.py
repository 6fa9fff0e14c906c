"""Loads from a model's own file beside loads from the graph onnxruntime optimized and kept.

For each real model (``real_models.fetch_models``: magika, ocr-cls, ocr-rec, nudenet from
their published wheels) and the demo's MLP, in one run, round after round:

- onnxruntime alone: an ``InferenceSession`` from the model's file (the ``all`` level, one
  intra-op thread) against one from the graph a first session wrote with
  ``optimized_model_filepath``, loaded with optimization off;
- a Host: ``Host.load`` without ``optimized_models``, with an empty folder (the load that
  writes the graph) and with the folder the previous load filled (the load that takes it).

Medians in milliseconds, and the ratio kept / plain. ``docs/host.md`` quotes the table::

    python benchmarks/optimized_loads.py [--rounds 5] [--models magika,ocr-cls,ocr-rec,nudenet]
"""

from __future__ import annotations

import argparse
import functools
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from benchmarks.real_models import fetch_models  # noqa: E402


def _timed(build: Callable[[], Any]) -> float:
    began = time.perf_counter()
    built = build()
    elapsed = time.perf_counter() - began
    del built
    return elapsed * 1000


def _ort_options(optimized: bool, saving: Path | None = None) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.use_per_session_threads = False  # the Runtime's global pools, as corral's sessions
    options.log_severity_level = 3
    if optimized:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if saving is not None:
        options.optimized_model_filepath = str(saving)
    return options


def main(argv: list[str] | None = None) -> int:
    """Measure each model's loads both ways, round after round; print the medians."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--models", default="magika,ocr-cls,ocr-rec,nudenet")
    args = parser.parse_args(argv)
    import onnxruntime as ort

    import corral
    from corral.testing import build_mlp

    corral.runtime().start()  # the global pools every session here runs on
    files, _ = fetch_models(args.models.split(","))
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        repo = root / "repo"
        models: dict[str, Path] = {}
        sizes: dict[str, int] = {}
        for name, source in [*files.items(), ("mlp", None)]:
            target = repo / name / "1" / "model.onnx"
            target.parent.mkdir(parents=True)
            if source is None:
                target.write_bytes(build_mlp())
            else:
                shutil.copyfile(source, target)
            models[name] = target
            sizes[name] = target.stat().st_size
        times: dict[tuple[str, str], list[float]] = {}
        cpu = ["CPUExecutionProvider"]
        for _ in range(args.rounds):
            for name, path in models.items():
                saved = root / f"{name}.optimized.onnx"
                ort.InferenceSession(str(path), _ort_options(False, saved), providers=cpu)
                for way, source, optimized in (
                    ("ort file", path, False),
                    ("ort optimized", saved, True),
                ):
                    build = functools.partial(
                        ort.InferenceSession, str(source), _ort_options(optimized), providers=cpu
                    )
                    times.setdefault((name, way), []).append(_timed(build))
            folder = root / "optimized"
            shutil.rmtree(folder, ignore_errors=True)
            ways = (("host plain", None), ("host writes", folder), ("host takes", folder))
            for way, kept in ways:
                folder_given = None if kept is None else str(kept)
                with corral.Host(repo, optimized_models=folder_given) as host:
                    for name in models:
                        load = functools.partial(host.load, name)
                        times.setdefault((name, way), []).append(_timed(load))
    print(
        "\n| model | file (KiB) | onnxruntime: file | optimized | ratio "
        "| Host.load: plain | writing | taking | ratio |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in models:
        med = {way: statistics.median(times[(name, way)]) for _, way in times if _ == name}
        print(
            f"| {name} | {sizes[name] // 1024:,} | {med['ort file']:.1f} | "
            f"{med['ort optimized']:.1f} | {med['ort optimized'] / med['ort file']:.2f}x | "
            f"{med['host plain']:.1f} | {med['host writes']:.1f} | {med['host takes']:.1f} | "
            f"{med['host takes'] / med['host plain']:.2f}x |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
