"""``corral check``: every problem in a model repository, with its fix, as serve finds them.

The repository is checked without loading a model (``corral._host.check``); ``--load`` also
loads each model, one at a time, and reports its estimated size and load time. Problems go
to stdout, the verdict to stderr; the exit status is 1 on any problem (2 for a bad argument,
or ``--load`` without rich, which the server and cli extras bring).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from corral._base import CorralError
from corral.cli.progress import progress_bar, require_rich

if TYPE_CHECKING:
    from corral._base import Problem
    from corral._host import Host

__all__ = ["run_check"]


def run_check(args: argparse.Namespace) -> int:
    """``corral check``: print every problem with its fix; exit status 1 on any."""
    import corral
    from corral._host import find_problems

    if args.load:
        require_rich("corral check --load")  # before any work, not after the scan
    with corral.Host(args.repository, memory_budget=args.memory_budget) as host:
        # find_problems, not Host.check: the problems are printed here, not logged.
        problems, _ = find_problems(
            host.repository,
            memory_budget=host.options.budget_bytes,
            pool_size=host.runtime.options.compute_workers,
            read_model_files=True,
        )
        loaded: list[dict[str, object]] = []
        if args.load:
            problems += _load_each(host, problems, loaded)
    if args.json:
        print(json.dumps({"problems": [_problem_dict(p) for p in problems], "loaded": loaded}))
    else:
        for problem in problems:
            print(
                f"{problem.kind.value}: {problem.path}\n  {problem.message}\n  fix: {problem.fix}"
            )
        for row in loaded:
            print(
                f"loaded {row['model']} version {row['version']}: {row['size_bytes']:,} bytes "
                f"(estimated), {row['load_seconds']:.3f} s"
            )
        count = len(problems)
        verdict = "no problems" if not count else f"{count} problem{'s' * (count != 1)}"
        print(f"corral check: {args.repository}: {verdict}", file=sys.stderr)
    return 1 if problems else 0


def _load_each(
    host: Host, problems: list[Problem], loaded: list[dict[str, object]]
) -> list[Problem]:
    """Load every model the check found no blocker in, one at a time, each then unloaded.

    Appends each load's version, estimated size and time to ``loaded``; returns the failures.
    """
    import time

    from corral._base import Problem, ProblemKind

    blocked = {p.model for p in problems if p.kind is not ProblemKind.NO_MODEL_FILE}
    names = [name for name in host.repository.names() if name not in blocked]
    failures: list[Problem] = []
    with progress_bar() as progress:
        task = progress.add_task(f"loading {len(names)} models", total=len(names))
        for name in names:
            progress.update(task, description=f"loading {name}")
            began = time.perf_counter()
            try:
                host.load(name)
            except CorralError as exc:
                failures.append(
                    Problem(
                        ProblemKind.LOAD_FAILED,
                        name,
                        str(host.repository.root / name),
                        f"model {name!r} failed to load: {exc}",
                        "fix what the error names (the model file, or what its settings declare)",
                    )
                )
            else:
                seconds = time.perf_counter() - began
                for version in host.status(name).versions:
                    if version.size_bytes:
                        loaded.append(
                            {
                                "model": name,
                                "version": version.version,
                                "size_bytes": version.size_bytes,
                                "load_seconds": round(seconds, 6),
                            }
                        )
                host.unload(name)  # one model's memory at a time
            progress.advance(task)
    return failures


def _problem_dict(problem: Problem) -> dict[str, object]:
    return {
        "kind": problem.kind.value,
        "model": problem.model,
        "path": problem.path,
        "message": problem.message,
        "fix": problem.fix,
    }
