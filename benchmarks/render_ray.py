"""Write ``bench_peers.py``'s figures for corral on Ray into ``docs/scale-out.md``.

Replaces what lies between the page's ``<!-- ray-bench:start -->`` and
``<!-- ray-bench:end -->`` markers with the table of this run, so the page's prose stays as
written and its figures always come from one run.

Example::

    python benchmarks/render_ray.py benchmarks/results/ray.json docs/scale-out.md
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

START = "<!-- ray-bench:start -->"
END = "<!-- ray-bench:end -->"
_LABELS = {
    "corral": "`corral serve` (one process)",
    "corral-ray": "`corral ray-serve`, 2 replicas",
    "ray-serve": "Ray Serve's own multiplexing deployment (hand-written, 1 replica)",
}


def table(document: dict[str, Any]) -> str:
    """The block between the markers: setup line, figures, ratio row."""
    settings = document["settings"]
    machine = document["machine"]
    peers = document["peers"]
    cells = sorted({(r["distribution"], r["connections"]) for p in peers for r in p["summary"]})
    lines = [
        f"Measured {document['date']} on {machine['cpus']} CPUs by `make bench-ray`: "
        f"{settings['models']:,} tiny models, wrk with the model picked per request, "
        f"{settings['rounds']} interleaved round(s) of {settings['duration_s']:g} s per cell, "
        "medians; requests/s (p50 / p99 latency, ms).",
        "",
        "| server | " + " | ".join(f"{d}, {c} conn." for d, c in cells) + " |",
        "|---|" + "---:|" * len(cells),
    ]
    by_peer: dict[str, dict[tuple[str, int], dict[str, Any]]] = {}
    for peer in peers:
        by_cell = {(r["distribution"], r["connections"]): r for r in peer["summary"]}
        by_peer[peer["peer"]] = by_cell
        row = [
            f"{r['requests_per_s']:,.0f} ({r['p50_ms']:.1f} / {r['p99_ms']:.1f})"
            + (f", {r['errors']} errors" if r["errors"] else "")
            if (r := by_cell.get(cell))
            else ""
            for cell in cells
        ]
        label = _LABELS.get(peer["peer"], peer["peer"])
        lines.append(f"| {label} | " + " | ".join(row) + " |")
    alone, ray = by_peer.get("corral"), by_peer.get("corral-ray")
    if alone and ray:
        ratios = [
            f"{ray[c]['requests_per_s'] / alone[c]['requests_per_s']:.3f}x"
            if c in ray and c in alone and alone[c]["requests_per_s"]
            else ""
            for c in cells
        ]
        lines.append("| corral on Ray ÷ corral alone | " + " | ".join(ratios) + " |")
    lines += [
        "",
        "| server | every model answered after | RSS (process tree) | threads |",
        "|---|---:|---:|---:|",
    ]
    for peer in peers:
        lines.append(
            f"| {_LABELS.get(peer['peer'], peer['peer'])} | "
            f"{peer['seconds_to_all_models']:.1f} s | {peer['rss_bytes'] / 2**20:,.0f} MiB | "
            f"{peer['threads']:,} |"
        )
    for name, reason in document["skipped"].items():
        lines.append(f"| {name} | skipped: {reason.splitlines()[0][:160]} | | |")
    return "\n".join(lines)


def render(document: dict[str, Any], page: str) -> str:
    """``page`` with the block between the markers replaced by :func:`table`."""
    head, found, rest = page.partition(START)
    _, found_end, tail = rest.partition(END)
    if not found or not found_end:
        raise ValueError(f"the page has no {START} ... {END} block")
    return f"{head}{START}\n{table(document)}\n{END}{tail}"


def main(argv: Sequence[str] | None = None) -> int:
    """Render the results into the page, in place."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, help="bench_peers.py's JSON")
    parser.add_argument("page", type=Path, help="the page to update (docs/scale-out.md)")
    args = parser.parse_args(argv)
    document = json.loads(args.results.read_text())
    args.page.write_text(render(document, args.page.read_text()))
    print(f"wrote the figures of {args.results} into {args.page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
