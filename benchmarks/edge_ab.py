"""corral serve's HTTP edge, side by side: another checkout, and uvicorn's plain protocol.

Serves one tiny model (``http_bench``'s depth-3 tree) from several ``corral serve`` processes
on 127.0.0.1 and loads each in turn with wrk posting the same v2 JSON body (and the binary one
with ``--binary``), round after round, so that the machine's noise falls on all alike:

- ``this``: ``corral serve`` from this checkout: corral's connection protocol with the direct
  route for the plainest inference requests (``corral.server.connections.edge``);
- ``this-edge-asgi``: the same protocol with the direct route off: every request through
  the ASGI app (what the access log or tracing cost aside);
- ``this-plain-uvicorn``: the same server on uvicorn's own httptools protocol, without
  corral's connection limits or direct route (what the adapter's coupling buys);
- ``before`` (with ``--before DIR``): ``corral serve`` from another checkout, such as a
  ``git worktree`` of the commit before a change;
- ``raw-asgi``: ``benchmarks/reference/raw_asgi.py``, the hand-written upper bound.

Every server's first answer is checked against onnxruntime in-process. The table gives each
target's median requests/s and p99, and each one's ratio to ``this`` and to ``raw-asgi`` as
the median of the per-round ratios::

    git worktree add /tmp/before HEAD~3
    python benchmarks/edge_ab.py --before /tmp/before [--rounds 6] [--duration 4]

The variants with the direct route off and on uvicorn's plain protocol are made by starting
``corral serve`` through a two-line launcher that swaps the protocol before serving; nothing
in corral has a switch for them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

from benchmarks import http_bench, server_processes  # noqa: E402
from benchmarks.http_bench import BenchmarkError, Payload  # noqa: E402

_MODEL = "tree"
# Starts `corral serve` with its HTTP connections on another protocol (argv[1]): "asgi" keeps
# corral's protocol without the direct route, "plain" uses uvicorn's own.
_LAUNCHER = """
import sys
import corral.server.connections.edge as edge
import corral.server.app as app
variant = sys.argv.pop(1)
protocol_for = edge.protocol_for
if variant == "asgi":
    app.protocol_for = lambda limits, direct=None, **_: protocol_for(limits)
elif variant == "plain":
    app.protocol_for = lambda limits, direct=None, **_: None
from corral.cli.commands import main
sys.exit(main())
"""


def _corral(
    checkout: Path, variant: str | None, repository: Path, port: int
) -> tuple[list[str], dict[str, str]]:
    argv = [sys.executable]
    argv += ["-c", _LAUNCHER, variant] if variant else ["-m", "corral.cli"]
    argv += ["serve", str(repository), "--http-port", str(port), "--grpc-port", "-1"]
    argv += ["--host", "127.0.0.1", "--log-level", "warning"]
    # The Python edge, which this benchmark compares (a checkout from before the native
    # edge reads the variable as no setting of its own, and says so).
    env = {**os.environ, "PYTHONPATH": str(checkout), "CORRAL_EDGE": "python"}
    return argv, env


def _servers(
    before: Path | None, repository: Path, ports: dict[str, int]
) -> dict[str, tuple[list[str], dict[str, str]]]:
    this = HERE.parent
    servers = {
        "this": _corral(this, None, repository, ports.get("this", 0)),
        "this-edge-asgi": _corral(this, "asgi", repository, ports.get("this-edge-asgi", 0)),
        "this-plain-uvicorn": _corral(
            this, "plain", repository, ports.get("this-plain-uvicorn", 0)
        ),
    }
    if before is not None:
        servers["before"] = _corral(before, None, repository, ports.get("before", 0))
    others = dict.fromkeys(http_bench.SERVERS, 0)
    raw = http_bench.server_commands(repository, _MODEL, {**others, **ports})["raw-asgi"]
    servers["raw-asgi"] = raw
    return {name: command for name, command in servers.items() if name in ports}


@contextlib.contextmanager
def _running(
    servers: dict[str, tuple[list[str], dict[str, str]]],
    ports: dict[str, int],
    payload: Payload,
    expected: dict[str, Any],
    logs: Path,
) -> Iterator[None]:
    path = f"/v2/models/{_MODEL}/infer"
    with contextlib.ExitStack() as stack:
        for name, (argv, env) in servers.items():
            log = logs / f"{name}.log"
            process = server_processes.start_process(argv, log, env)
            stack.callback(server_processes.stop_process, process)
            answer = http_bench.wait_until_answers(process, name, ports[name], path, payload, log)
            http_bench.check_answer(name, answer, expected)
            print(f"  {name}: pid {process.pid}, port {ports[name]}, answers", file=sys.stderr)
        yield


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Run the rounds; returns every run's figures and the summary."""
    wrk = http_bench.wrk_path()
    with tempfile.TemporaryDirectory(prefix="corral-edge-ab-") as scratch:
        root = Path(scratch)
        repository = root / "models"
        model_path = repository / _MODEL / "1" / "model.onnx"
        model_path.parent.mkdir(parents=True)
        model_path.write_bytes(http_bench.build_model(_MODEL))
        features = http_bench.make_features(1, 4)
        payloads = {"json": http_bench.json_payload(features)}
        if args.binary:
            payloads["binary"] = http_bench.binary_payload(features)
        expected = http_bench.reference_outputs(model_path, features)
        names = ["this", "this-edge-asgi", "this-plain-uvicorn", "raw-asgi"]
        if args.before is not None:
            names.insert(1, "before")
        if args.targets:
            names = [name for name in names if name in args.targets]
        ports = {name: http_bench.free_port() for name in names}
        bodies = {}
        for kind, payload in payloads.items():
            bodies[kind] = root / f"{kind}.body"
            bodies[kind].write_bytes(payload.body)
        runs: list[dict[str, Any]] = []
        servers = _servers(args.before, repository, ports)
        with _running(servers, ports, payloads["json"], expected, root):
            for round_index in range(args.warmup_rounds + args.rounds):
                for kind, payload in payloads.items():
                    for name in names:
                        if kind == "binary" and name == "raw-asgi":
                            continue  # the raw handler reads JSON only
                        url = f"http://127.0.0.1:{ports[name]}/v2/models/{_MODEL}/infer"
                        command = http_bench.wrk_command(
                            wrk,
                            url,
                            bodies[kind],
                            payload,
                            connections=args.connections,
                            threads=2,
                            duration_s=args.duration,
                        )
                        figures = http_bench.run_load(command, args.duration)
                        if round_index < args.warmup_rounds:
                            continue
                        rate = figures["requests"] / (figures["duration_us"] / 1e6)
                        runs.append(
                            {
                                "round": round_index - args.warmup_rounds,
                                "target": f"{name} {kind}",
                                "requests_per_s": rate,
                                "p99_us": figures["latency_us"]["p99"],
                                "errors": sum(figures["errors"].values()),
                            }
                        )
                        print(
                            f"  round {round_index}: {name} {kind}: {rate:,.0f} req/s",
                            file=sys.stderr,
                        )
    return {"runs": runs, "summary": summarize(runs)}


def summarize(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per target: medians over rounds, and the median per-round ratio to this and raw-asgi."""
    by_round: dict[tuple[int, str], float] = {
        (run["round"], run["target"]): run["requests_per_s"] for run in runs
    }
    rows = []
    for target in dict.fromkeys(run["target"] for run in runs):
        mine = [run for run in runs if run["target"] == target]
        kind = target.rsplit(" ", 1)[1]
        row: dict[str, Any] = {
            "target": target,
            "requests_per_s": statistics.median(run["requests_per_s"] for run in mine),
            "p99_us": statistics.median(run["p99_us"] for run in mine),
            "errors": sum(run["errors"] for run in mine),
        }
        for baseline in (f"this {kind}", "raw-asgi json"):
            ratios = [
                run["requests_per_s"] / by_round[(run["round"], baseline)]
                for run in mine
                if (run["round"], baseline) in by_round
            ]
            row[f"/ {baseline}"] = statistics.median(ratios) if ratios else None
        rows.append(row)
    return rows


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """The summary as a Markdown table."""
    lines = [
        "| target | requests/s | p99 ms | errors | / this | / raw-asgi |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        kind = row["target"].rsplit(" ", 1)[1]
        this, raw = row[f"/ this {kind}"], row["/ raw-asgi json"]
        lines.append(
            f"| {row['target']} | {row['requests_per_s']:,.0f} | {row['p99_us'] / 1000:.2f} | "
            f"{row['errors']} | {'-' if this is None else f'{this:.2f}x'} | "
            f"{'-' if raw is None else f'{raw:.2f}x'} |"
        )
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, help="another checkout to serve beside this one")
    parser.add_argument("--rounds", type=int, default=6, help="rounds measured (6)")
    parser.add_argument("--warmup-rounds", type=int, default=1, help="rounds not recorded (1)")
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per run (4)")
    parser.add_argument("--connections", type=int, default=16, help="wrk connections (16)")
    parser.add_argument("--binary", action="store_true", help="also the binary tensor body")
    parser.add_argument(
        "--targets", type=lambda text: text.split(","), help="only these targets, comma-separated"
    )
    parser.add_argument("--json", type=Path, help="also write every run's figures here")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the comparison and print its table."""
    args = _parser().parse_args(argv)
    if args.before is not None and not (args.before / "corral" / "__init__.py").is_file():
        print(f"edge_ab: {args.before} is not a corral checkout", file=sys.stderr)
        return 2
    try:
        result = measure(args)
    except BenchmarkError as exc:
        print(f"edge_ab: {exc}", file=sys.stderr)
        return 1
    print(format_table(result["summary"]))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
