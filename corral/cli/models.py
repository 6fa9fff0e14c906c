"""``corral models``: a model repository's models, their states, versions and sizes.

With ``--preload`` every model is loaded first (a progress bar on stderr shows it) and the
ones that fail are reported; the table, or the JSON with ``--json``, goes to stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from corral.cli.progress import progress_bar, require_rich

if TYPE_CHECKING:
    from rich.table import Table

    from corral._host import HostStats, ModelStatus

__all__ = ["run_models"]


def run_models(args: argparse.Namespace) -> int:
    """``corral models``: the repository's models and their states; ``--preload`` first."""
    require_rich("corral models")
    from rich.console import Console

    import corral

    budget = args.memory_budget
    with corral.Host(args.repository, memory_budget=budget) as host:
        failures: dict[str, corral.CorralError] = {}
        if args.preload:
            names = host.repository.names()
            with progress_bar() as progress:
                task = progress.add_task(f"loading {len(names)} models", total=len(names))

                def on_loaded(
                    done: int, total: int, name: str, error: corral.CorralError | None
                ) -> None:
                    done_word = "loaded" if error is None else "failed"
                    progress.update(task, completed=done, description=f"{done_word} {name}")

                failures = host.preload(names, progress=on_loaded)
        statuses = host.models()
        stats = host.stats()
    if args.json:
        print(json.dumps([_status_dict(status) for status in statuses], indent=2))
    else:
        Console().print(_models_table(statuses, stats))
    for name, error in sorted(failures.items()):
        print(f"corral models: {name}: {error}", file=sys.stderr)
    return 1 if failures else 0


def _status_dict(status: ModelStatus) -> dict[str, object]:
    return {
        "name": status.name,
        "state": status.state.value,
        "failure": status.failure,
        "versions": [
            {
                "version": v.version,
                "state": v.state.value,
                "size_bytes": v.size_bytes,
                "runs": v.runs,
                "failure": v.failure,
                "batching": v.batching,
            }
            for v in status.versions
        ],
    }


def _models_table(statuses: list[ModelStatus], stats: HostStats) -> Table:
    from rich.table import Table

    budget = "no budget" if stats.memory_budget is None else f"{stats.memory_budget:,} bytes"
    table = Table(
        title=f"{len(statuses):,} models",
        caption=(
            f"{stats.loaded_versions:,} versions loaded, {stats.bytes_used:,} bytes of {budget}"
        ),
    )
    table.add_column("model")
    table.add_column("state")
    table.add_column("versions", justify="right")
    table.add_column("size (KiB)", justify="right")
    table.add_column("why it failed")
    for status in statuses:
        size = sum(v.size_bytes for v in status.versions)
        versions = ", ".join(f"{v.version} {v.state.value}" for v in status.versions) or "-"
        failure = status.failure or next((v.failure for v in status.versions if v.failure), "")
        table.add_row(
            status.name,
            status.state.value,
            versions,
            f"{size / 1024:,.0f}" if size else "-",
            failure or "",
        )
    return table
