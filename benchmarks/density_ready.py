"""Every model loaded at start: time to ready, memory, threads and stop time, corral beside Triton.

For each model count (1,000 and 2,000 by default) it writes one repository of the demo's
tiny models (``footprint.build_repository``: tree, linear and MLP in turn) with a
``config.pbtxt`` in every folder (``peers.triton_ort.write_configs``: ``max_batch_size: 0``,
read by both servers alike), then, round after round, starts each server told to load every
model at start and measures:

- time to ready: from the process's start until ``/v2/health/ready`` answers 200 *and* the
  repository index lists every model ``READY`` (Triton is ready only with every model
  loaded; corral is ready sooner, so the index is what both are held to);
- RSS and threads once ready (``/proc/<pid>/status``);
- time to stop: from SIGTERM until the process has exited (SIGKILL after 60 s, reported).

corral: ``corral serve REPO --load-model '*'``, its modules compiled to bytecode first (as
pip compiles an installed wheel's; an editable install under ``PYTHONDONTWRITEBYTECODE``
would compile every module again at each start, about 0.15 s of its time to ready); Triton
(when built, ``make triton-peer``): ``tritonserver --model-control-mode=explicit
--load-model=*`` with one onnxruntime pool of one thread (``peers.triton_ort.triton_argv``).
Each server answers one inference of the first model before it is stopped, checked against
onnxruntime in-process::

    python benchmarks/density_ready.py [--counts 1000,2000] [--rounds 2] [--json FILE]
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from benchmarks import http_bench, server_processes  # noqa: E402
from benchmarks.footprint import build_repository  # noqa: E402
from benchmarks.peers import PeerUnavailable, triton_ort  # noqa: E402

_READY_TIMEOUT_S = 600.0
_STOP_TIMEOUT_S = 60.0


def _get(url: str, body: bytes | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, method="POST" if body is not None else "GET")
    if body is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:
        return 0, b""


def _all_ready(http: str, count: int) -> bool:
    status, _ = _get(f"{http}/v2/health/ready")
    if status != 200:
        return False
    status, body = _get(f"{http}/v2/repository/index", b"{}")
    if status != 200:
        return False
    rows = json.loads(body)
    return sum(1 for row in rows if row.get("state") == "READY") >= count


def _proc_status(pid: int) -> tuple[float, int]:
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    rss_mib = int(fields["VmRSS"].split()[0]) / 1024
    return rss_mib, int(fields["Threads"])


def _check_answer(http: str, model_file: Path) -> None:
    features = np.array([[0.1, 0.2, 0.3, 0.4]], np.float32)
    body = json.dumps(
        {
            "inputs": [
                {"name": "X", "datatype": "FP32", "shape": [1, 4], "data": [0.1, 0.2, 0.3, 0.4]}
            ]
        }
    ).encode()
    name = model_file.parent.parent.name
    status, answer = _get(f"{http}/v2/models/{name}/infer", body)
    if status != 200:
        raise RuntimeError(f"{http} answered {status} to an inference of {name}: {answer[:200]!r}")
    expected = http_bench.reference_outputs(model_file, features)
    for output in json.loads(answer)["outputs"]:
        want = np.asarray(expected[output["name"]]).ravel()
        got = np.asarray(output["data"], want.dtype)
        if not np.allclose(got, want, rtol=1e-6, atol=1e-6):
            raise RuntimeError(f"{http} answered {got} for {name}, not {want}")


def _measure(
    name: str, argv: list[str], http: str, count: int, first: Path, log: Path
) -> dict[str, Any]:
    started = time.monotonic()
    process = server_processes.start_process(argv, log, dict(os.environ))
    try:
        while not _all_ready(http, count):
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited with {process.returncode}: see {log}")
            if time.monotonic() - started > _READY_TIMEOUT_S:
                raise RuntimeError(f"{name} was not ready within {_READY_TIMEOUT_S:.0f} s")
            time.sleep(0.05)
        ready_s = time.monotonic() - started
        rss_mib, threads = _proc_status(process.pid)
        _check_answer(http, first)
    finally:
        stopping = time.monotonic()
        code = server_processes.stop_process(process, _STOP_TIMEOUT_S)
        stop_s = time.monotonic() - stopping
    return {
        "server": name,
        "count": count,
        "ready_s": ready_s,
        "rss_mib": rss_mib,
        "threads": threads,
        "stop_s": stop_s,
        "killed": stop_s >= _STOP_TIMEOUT_S,
        "exit": code,
    }


def _compile_corral() -> None:
    """Compile corral's modules to bytecode, as installing its wheel does; raise if one fails."""
    import corral

    package = Path(corral.__file__).parent
    if not compileall.compile_dir(package, quiet=1):
        raise RuntimeError(f"compileall could not compile every module of {package}")


def main(argv: list[str] | None = None) -> int:
    """Measure each server at each count, round after round; print the medians."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--counts", default="1000,2000")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None, help="write every run here too")
    args = parser.parse_args(argv)
    counts = [int(c) for c in args.counts.split(",")]
    try:
        build: triton_ort.TritonBuild | None = triton_ort.find_build()
    except PeerUnavailable as exc:
        print(triton_ort.not_built_line(str(exc)))
        build = None
    _compile_corral()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as scratch:
        for count in counts:
            repo = Path(scratch) / f"repo{count}"
            files = build_repository(repo, count)
            triton_ort.write_configs(repo)
            for round_ in range(args.rounds):
                servers = ["corral", "triton"] if build is not None else ["corral"]
                if round_ % 2:
                    servers.reverse()  # each starts first in every other round
                for server in servers:
                    http_port = http_bench.free_port()
                    grpc_port = http_bench.free_port()
                    http = f"http://127.0.0.1:{http_port}"
                    log = Path(scratch) / f"{server}-{count}-{round_}.log"
                    if server == "corral":
                        command = [sys.executable, "-m", "corral.cli", "serve", str(repo)]
                        command += ["--http-port", str(http_port), "--grpc-port", str(grpc_port)]
                        command += ["--load-model", "*", "--log-level", "warning"]
                    else:
                        assert build is not None
                        ports = (http_port, grpc_port, http_bench.free_port())
                        command = triton_ort.triton_argv(build, repo, *ports)
                        command += ["--model-control-mode=explicit", "--load-model=*"]
                    run = _measure(server, command, http, count, files[0], log)
                    runs.append(run)
                    print(
                        f"{count} models, round {round_ + 1}, {server}: ready in "
                        f"{run['ready_s']:.2f} s, {run['rss_mib']:.0f} MiB, "
                        f"{run['threads']} threads, stopped in {run['stop_s']:.2f} s"
                        + (" (SIGKILL)" if run["killed"] else ""),
                        flush=True,
                    )
    print("\n| models | server | time to ready (s) | RSS (MiB) | threads | time to stop (s) |")
    print("|---:|---|---:|---:|---:|---:|")
    for count in counts:
        for server in ("corral", "triton"):
            rows = [r for r in runs if r["server"] == server and r["count"] == count]
            if not rows:
                continue
            killed = " (SIGKILL)" if any(r["killed"] for r in rows) else ""
            print(
                f"| {count:,} | {server} | "
                f"{statistics.median(r['ready_s'] for r in rows):.2f} | "
                f"{statistics.median(r['rss_mib'] for r in rows):.0f} | "
                f"{statistics.median(r['threads'] for r in rows):.0f} | "
                f"{statistics.median(r['stop_s'] for r in rows):.2f}{killed} |"
            )
    if args.json is not None:
        args.json.write_text(json.dumps(runs, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
