"""What the row-independence probe adds to a model's load time, side by side in one run.

Writes the same models into two repositories: in one each model's model.toml declares
``max_batch_size = 64`` (batched, not probed), in the other it says nothing (the load probes
it, and a probed tree, linear model or MLP is batched at 64 rows too). Each round loads every
model of both with a fresh Host (``Host.preload``), in alternating order so that neither
side always runs on a warmer process, and reports the median load time per model of each
side and their difference: the probe's cost. It also times the probe alone
(``corral._compute.probe.probe_rows``) on each loaded model.

From a checkout::

    python benchmarks/probe.py [--models 1000] [--rounds 5] [--model FILE ...] [--json]

``--model FILE`` adds a real model, loaded alone ``--rounds`` times per side; for example a
CNN from a wheel on PyPI::

    pip download rapidocr-onnxruntime --no-deps -d /tmp/wheels
    unzip -j /tmp/wheels/rapidocr_onnxruntime-*.whl '*/ch_PP-OCRv4_det_infer.onnx' -d /tmp
    python benchmarks/probe.py --model /tmp/ch_PP-OCRv4_det_infer.onnx

Progress goes to stderr, a Markdown table (or with ``--json`` the raw results) to stdout.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TypedDict

import corral
from corral._compute.probe import probe_rows
from corral.testing import ModelKind, build_model

__all__ = ["ProbeCost", "main", "measure_probe_cost"]

_MODEL_KINDS: tuple[ModelKind, ...] = ("tree", "linear", "mlp")
_DECLARED = "max_batch_size = 64\n"


class ProbeCost(TypedDict):
    """What :func:`measure_probe_cost` measured for one set of models."""

    #: What was loaded: ``"1,000 tiny models"`` or a model file's name.
    what: str
    models: int
    rounds: int
    #: Seconds to load every model, per round: declared (no probe) and probed.
    declared_seconds: list[float]
    probed_seconds: list[float]
    #: Median milliseconds per model of each side, and their difference.
    declared_ms_per_model: float
    probed_ms_per_model: float
    probe_ms_per_model: float
    #: The probe alone on the loaded models: median milliseconds per model.
    probe_alone_ms: float
    #: How the probe decided, by reason (the first words), over the models.
    decisions: dict[str, int]


def measure_probe_cost(models: dict[str, bytes], rounds: int, what: str) -> ProbeCost:
    """Load ``models`` (name -> ONNX bytes) ``rounds`` times with and without the probe."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    work = Path(tempfile.mkdtemp(prefix="corral-probe-bench-"))
    try:
        declared_root, probed_root = work / "declared", work / "probed"
        for name, model in models.items():
            for root in (declared_root, probed_root):
                (root / name / "1").mkdir(parents=True)
                (root / name / "1" / "model.onnx").write_bytes(model)
            (declared_root / name / "model.toml").write_text(_DECLARED)
        declared: list[float] = []
        probed: list[float] = []
        for index in range(rounds):
            sides = [(declared_root, declared), (probed_root, probed)]
            for root, times in sides if index % 2 == 0 else sides[::-1]:
                times.append(_load_all(root))
            print(f"{what}: round {index + 1} of {rounds}", file=sys.stderr)
        alone, decisions = _probe_alone(probed_root)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    count = len(models)
    declared_ms = statistics.median(declared) / count * 1e3
    probed_ms = statistics.median(probed) / count * 1e3
    return ProbeCost(
        what=what,
        models=count,
        rounds=rounds,
        declared_seconds=declared,
        probed_seconds=probed,
        declared_ms_per_model=declared_ms,
        probed_ms_per_model=probed_ms,
        probe_ms_per_model=probed_ms - declared_ms,
        probe_alone_ms=alone,
        decisions=decisions,
    )


def _load_all(root: Path) -> float:
    with corral.Host(root) as host:
        started = time.perf_counter()
        failures = host.preload()
        elapsed = time.perf_counter() - started
    if failures:
        raise SystemExit(f"loading {root} failed: {failures}")
    return elapsed


def _probe_alone(root: Path) -> tuple[float, dict[str, int]]:
    """The probe's own time on each loaded model, and what each load decided."""
    times: list[float] = []
    decisions: dict[str, int] = {}
    with corral.Host(root) as host:
        host.preload()
        for name in host.repository.names():
            with host.acquire(name) as lease:
                decision = lease.batching.split(":")[0]
                decisions[decision] = decisions.get(decision, 0) + 1
                started = time.perf_counter()
                probe_rows(lease.session.signature, lease.session.run)
                times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3, decisions


def cost_table(results: list[ProbeCost]) -> str:
    """The results as a Markdown table, one row per set of models."""
    lines = [
        "| models | rounds | load, declared (ms/model) | load, probed (ms/model) "
        "| probe's cost (ms/model) | probe alone (ms/model) | decided |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        decided = ", ".join(f"{count} {what}" for what, count in sorted(r["decisions"].items()))
        lines.append(
            f"| {r['what']} | {r['rounds']} | {r['declared_ms_per_model']:.3f} "
            f"| {r['probed_ms_per_model']:.3f} | {r['probe_ms_per_model']:+.3f} "
            f"| {r['probe_alone_ms']:.3f} | {decided} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """The command line: measure, then print the table (or the JSON)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--models", type=int, default=1000, help="tiny models (default 1000)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per side (default 5)")
    parser.add_argument(
        "--model", type=Path, action="append", default=[], help="a real model file to add"
    )
    parser.add_argument("--json", action="store_true", help="print the raw results as JSON")
    args = parser.parse_args(argv)
    tiny = {
        f"m{index:05d}": build_model(_MODEL_KINDS[index % len(_MODEL_KINDS)], seed=index)
        for index in range(args.models)
    }
    results = [measure_probe_cost(tiny, args.rounds, f"{args.models:,} tiny models")]
    for path in args.model:
        results.append(measure_probe_cost({"model": path.read_bytes()}, args.rounds, path.name))
    meta = f"corral {corral.__version__}, Python {sys.version.split()[0]}"
    if args.json:
        print(json.dumps({"meta": meta, "results": results}, indent=2))
    else:
        print(cost_table(results))
        print(f"\n{meta}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
