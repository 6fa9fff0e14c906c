"""Render ``bench_peers.py``'s JSON (and the density figures) into ``docs/benchmarks.md`` + PNGs.

Example::

    python benchmarks/render_peers.py benchmarks/results/peers-full.json \
        --density benchmarks/results/density.json --out docs
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

PAGE = "benchmarks.md"
THROUGHPUT_PNG = "benchmarks-throughput.png"
LATENCY_PNG = "benchmarks-p99.png"
#: Where benchmarks/real_models.py's section starts (its ``BEGIN``).
REAL_MODELS_MARKER = "<!-- real-models: begin"
_ENGINES = {
    "corral-host": "corral Host",
    "onnxruntime-default": "onnxruntime, default sessions",
    "onnxruntime-global": "onnxruntime, global pools",
}


def plot(document: dict[str, Any], out: Path) -> None:
    """Requests/s and p99 latency by connections, one line per peer, per distribution."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    distributions = document["settings"]["distributions"]
    for filename, key, label in (
        (THROUGHPUT_PNG, "requests_per_s", "requests/s (median)"),
        (LATENCY_PNG, "p99_ms", "p99 latency, ms (median)"),
    ):
        figure, axes = plt.subplots(1, len(distributions), figsize=(5.5 * len(distributions), 4))
        axes_list = axes if len(distributions) > 1 else [axes]
        for axis, distribution in zip(axes_list, distributions, strict=True):
            for peer in document["peers"]:
                rows = [r for r in peer["summary"] if r["distribution"] == distribution]
                axis.plot(
                    [r["connections"] for r in rows],
                    [r[key] for r in rows],
                    marker="o",
                    label=peer["peer"],
                )
            axis.set_xscale("log", base=2)
            axis.set_title(f"requests over models: {distribution}")
            axis.set_xlabel("connections")
            axis.set_ylabel(label)
            axis.grid(alpha=0.3)
            axis.legend()
        figure.tight_layout()
        figure.savefig(out / filename, dpi=110)
        plt.close(figure)


def page(document: dict[str, Any], density: list[dict[str, Any]] | None) -> str:
    """The markdown page."""
    settings = document["settings"]
    machine = document["machine"]
    lines = [
        "# corral against the peers",
        "",
        "Made by `make bench` (`benchmarks/bench_peers.py`, then `benchmarks/render_peers.py`); "
        f"measured {document['date']} on {machine['cpus']} CPUs ({machine['platform']}, "
        f"Python {machine['python']}).",
        "",
        f"Every peer serves the same {settings['models']:,} tiny models (trees, linear models, "
        "MLPs; input `X` float32 [1, 4]) over v2 HTTP on 127.0.0.1, and is driven by the same "
        "client (wrk, `benchmarks/peers.lua`) with the same body, the model picked per request "
        "uniformly or Zipf-skewed (exponent 1). "
        f"{settings['rounds']} round(s) of {settings['duration_s']:g} s per cell, peers in "
        "turn, medians shown.",
        "",
        "Versions: "
        + "; ".join(
            f"{name} {pins.split(' Copyright')[0]}"
            for name, pins in document.get("versions", {}).items()
        )
        + ".",
        "",
        "**Read with care:** the client runs on the same machine as the servers and takes CPU "
        "they would use, and the peers idle side by side while one is measured; absolute "
        "figures do not carry to another machine or run. Only ratios within this run compare.",
        "",
        "## Start-up, memory and threads",
        "",
        "| peer | every model answered after | RSS (process tree) | threads |",
        "|---|---:|---:|---:|",
    ]
    for peer in document["peers"]:
        lines.append(
            f"| {peer['peer']} | {peer['seconds_to_all_models']:.1f} s | "
            f"{peer['rss_bytes'] / 2**20:,.0f} MiB | {peer['threads']:,} |"
        )
    for name, reason in document["skipped"].items():
        lines.append(f"| {name} | skipped: {reason.splitlines()[0][:160]} | | |")
    lines += ["", "## Requests/s (p50 / p99 latency, ms)", ""]
    corral = next((p for p in document["peers"] if p["peer"] == "corral"), None)
    cells = sorted(
        {(r["distribution"], r["connections"]) for p in document["peers"] for r in p["summary"]}
    )
    header = "| peer | " + " | ".join(f"{d}, {c} conn." for d, c in cells) + " |"
    lines += [header, "|---|" + "---:|" * len(cells)]
    for peer in document["peers"]:
        by_cell = {(r["distribution"], r["connections"]): r for r in peer["summary"]}
        row = []
        for cell in cells:
            r = by_cell.get(cell)
            row.append(
                ""
                if r is None
                else f"{r['requests_per_s']:,.0f} ({r['p50_ms']:.1f} / {r['p99_ms']:.1f})"
            )
        lines.append(f"| {peer['peer']} | " + " | ".join(row) + " |")
    if corral is not None:
        lines += ["", "corral's requests/s over each peer's, same cell:", ""]
        corral_cells = {(r["distribution"], r["connections"]): r for r in corral["summary"]}
        behind: list[str] = []
        lines += [header, "|---|" + "---:|" * len(cells)]
        for peer in document["peers"]:
            if peer["peer"] == "corral":
                continue
            by_cell = {(r["distribution"], r["connections"]): r for r in peer["summary"]}
            row = []
            for cell in cells:
                ours, theirs = corral_cells.get(cell), by_cell.get(cell)
                if ours and theirs and theirs["requests_per_s"]:
                    ratio = ours["requests_per_s"] / theirs["requests_per_s"]
                    row.append(f"{ratio:.2f}x")
                    if ratio < 1:
                        behind.append(f"{peer['peer']} at {cell[0]}, {cell[1]} connections")
                else:
                    row.append("")
            lines.append(f"| vs {peer['peer']} | " + " | ".join(row) + " |")
        lines.append("")
        if behind:
            lines.append("corral is **not ahead** of: " + "; ".join(behind) + ".")
        else:
            lines.append("corral is ahead of every peer measured, in every cell.")
    lines += [
        "",
        f"![requests/s]({THROUGHPUT_PNG})",
        "",
        f"![p99 latency]({LATENCY_PNG})",
        "",
    ]
    notes = Path(__file__).resolve().parent / "peers-notes.md"
    if notes.exists():
        # Written by hand, kept across regenerations: how each peer was set up, and why
        # corral is or is not ahead of it.
        lines += [notes.read_text().rstrip(), ""]
    if density:
        lines += [
            "## Density: many models in one process",
            "",
            "`benchmarks/footprint.py`: each engine loads the models in its own process.",
            "",
            "| models | engine | threads | RSS per model | load time |",
            "|---:|---|---:|---:|---:|",
        ]
        for row in density:
            lines.append(
                f"| {row['count']:,} | {_ENGINES.get(row['engine'], row['engine'])} | "
                f"{row['threads_after']:,} | {row['rss_per_model'] / 1024:,.1f} KiB | "
                f"{row['load_seconds']:.2f} s |"
            )
        lines.append("")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Render the page and the plots."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, help="bench_peers.py's JSON")
    parser.add_argument("--density", type=Path, help="`benchmarks/footprint.py --json FILE` output")
    parser.add_argument("--out", type=Path, default=Path("docs"), help="folder (default docs)")
    args = parser.parse_args(argv)
    document = json.loads(args.results.read_text())
    density = json.loads(args.density.read_text()) if args.density else None
    args.out.mkdir(parents=True, exist_ok=True)
    plot(document, args.out)
    # The "Real models" section is benchmarks/real_models.py's: kept as it is.
    kept = ""
    if (args.out / PAGE).is_file():
        _, marker, rest = (args.out / PAGE).read_text().partition(REAL_MODELS_MARKER)
        kept = f"\n## Real models\n\n{marker}{rest}" if marker else ""
    (args.out / PAGE).write_text(page(document, density) + kept)
    print(f"wrote {args.out / PAGE}, {args.out / THROUGHPUT_PNG}, {args.out / LATENCY_PNG}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
