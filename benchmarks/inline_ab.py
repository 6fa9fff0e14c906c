"""corral serve with the inline lane off and on, side by side over sockets: requests/s and CPU.

Starts one ``corral serve`` of a tiny model (the 4-feature MLP by default) per variant, each
with its own ``CORRAL_INLINE_RUN_US`` (0: the lane off), checks that every variant answers
the same outputs, then drives each in turn with wrk (16 connections unless told, the same v2
JSON body as ``make bench-http``), round after round, so that other work on the machine falls on all
of them alike. Each run's server CPU (user + system, from ``/proc``) is divided by the
requests it answered::

    python benchmarks/inline_ab.py [--rounds 5] [--seconds 4] [--bounds 0,50,200] [--model mlp]
        [--connections 16] [--grpc]

``--grpc`` drives ModelInfer over gRPC instead (``http_bench.py grpc-client``: asyncio tasks
on one grpc.aio channel, the request serialized once), each answer checked the same way.

Prints one line per run, then per variant the median requests/s, p99, and CPU µs a request,
and each variant's median ratio to the lane off in the same round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import http_bench  # a script beside this one: the model, the body and the reference answer

_LUA = Path(__file__).resolve().parent / "infer.lua"
_MODEL = "model"
_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime


def _post(port: int, body: bytes) -> dict[str, object]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v2/models/{_MODEL}/infer",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())  # type: ignore[no-any-return]


def _wait_ready(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"corral serve on port {port} exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"corral serve on port {port} was not ready within 60 s")


def _wrk(port: int, body_file: Path, seconds: int, connections: int) -> dict[str, object]:
    url = f"http://127.0.0.1:{port}/v2/models/{_MODEL}/infer"
    threads = min(2, connections)
    command = [
        "wrk",
        f"-t{threads}",
        f"-c{connections}",
        f"-d{seconds}s",
        "-s",
        str(_LUA),
        url,
        "--",
    ]
    command += [str(body_file), "application/json"]
    out = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 30).stdout
    line = next(x for x in out.splitlines() if x.startswith("CORRAL_WRK_RESULT "))
    result: dict[str, object] = json.loads(line.split(" ", 1)[1])
    if any(result["errors"].values()):  # type: ignore[attr-defined]
        raise RuntimeError(f"wrk saw errors on port {port}: {result['errors']}")
    return result


def _grpc(port: int, seconds: int, connections: int) -> dict[str, object]:
    script = Path(__file__).resolve().parent / "http_bench.py"
    command = [sys.executable, str(script), "grpc-client", "--port", str(port)]
    command += ["--model", _MODEL, "--connections", str(connections), "--duration", str(seconds)]
    out = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 60).stdout
    line = next(x for x in out.splitlines() if x.startswith(http_bench.RESULT_MARKER))
    result: dict[str, object] = json.loads(line[len(http_bench.RESULT_MARKER) :])
    if any(result["errors"].values()):  # type: ignore[attr-defined]
        raise RuntimeError(f"the gRPC client saw errors on port {port}: {result['errors']}")
    return result


def main(argv: list[str] | None = None) -> int:
    """Run the variants side by side and print the table; the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=4)
    parser.add_argument("--bounds", default="0,50,200", help="inline_run_us of each variant")
    parser.add_argument("--model", choices=("mlp", "tree"), default="mlp")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--base-port", type=int, default=18300)
    parser.add_argument("--grpc", action="store_true", help="drive ModelInfer over gRPC")
    args = parser.parse_args(argv)
    bounds = [int(b) for b in args.bounds.split(",")]
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        model_path = root / "models" / _MODEL / "1" / "model.onnx"
        model_path.parent.mkdir(parents=True)
        model_path.write_bytes(http_bench.build_model(args.model))
        features = np.array([[0.1, 0.2, 0.3, 0.4]], np.float32)
        body = json.dumps(
            {
                "inputs": [
                    {"name": "X", "datatype": "FP32", "shape": [1, 4], "data": [0.1, 0.2, 0.3, 0.4]}
                ]
            }
        ).encode()
        body_file = root / "body.json"
        body_file.write_bytes(body)
        expected = http_bench.reference_outputs(model_path, features)
        # What http_bench.py grpc-client sends: its own features.
        expected_grpc = http_bench.reference_outputs(model_path, http_bench.make_features(1, 4))
        servers: dict[int, tuple[int, subprocess.Popen[bytes]]] = {}
        try:
            for index, bound in enumerate(bounds):
                port = args.base_port + 2 * index
                env = {**os.environ, "CORRAL_INLINE_RUN_US": str(bound)}
                env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)
                command = [
                    sys.executable,
                    "-m",
                    "corral.cli",
                    "serve",
                    str(root / "models"),
                ]
                grpc_port = str(port + 1) if args.grpc else "-1"
                command += ["--host", "127.0.0.1", "--http-port", str(port)]
                command += ["--grpc-port", grpc_port]
                command += ["--log-level", "warning"]
                servers[bound] = (
                    port,
                    subprocess.Popen(
                        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                    ),
                )
            for bound, (port, process) in servers.items():
                _wait_ready(port, process)
                answer = _post(port, body)
                for output in answer["outputs"]:  # type: ignore[attr-defined]
                    want = np.asarray(expected[output["name"]]).ravel()
                    got = np.asarray(output["data"], want.dtype)
                    if not np.array_equal(got, want):
                        raise RuntimeError(f"inline_run_us={bound} answered {got}, not {want}")
            figures: dict[int, list[tuple[float, float, float]]] = {b: [] for b in bounds}
            ratios: dict[int, list[float]] = {b: [] for b in bounds}
            for round_ in range(args.rounds + 1):  # round 0 warms up, unrecorded
                rates = {}
                for bound, (port, process) in servers.items():
                    cpu = _cpu_seconds(process.pid)
                    if args.grpc:
                        result = _grpc(port + 1, args.seconds, args.connections)
                        got = np.asarray(result["outputs"]["Y"], np.float32)  # type: ignore[index]
                        if not np.array_equal(got, np.asarray(expected_grpc["Y"]).ravel()):
                            raise RuntimeError(f"inline_run_us={bound} answered {got} over gRPC")
                    else:
                        result = _wrk(port, body_file, args.seconds, args.connections)
                    cpu = _cpu_seconds(process.pid) - cpu
                    requests = int(result["requests"])  # type: ignore[call-overload]
                    rate = requests / (int(result["duration_us"]) / 1e6)  # type: ignore[call-overload]
                    p99 = int(result["latency_us"]["p99"]) / 1e3  # type: ignore[index]
                    per = cpu / requests * 1e6
                    rates[bound] = rate
                    if round_:
                        figures[bound].append((rate, p99, per))
                    print(
                        f"round {round_} inline_run_us={bound:<5} {rate:>9,.0f} requests/s "
                        f"p99 {p99:6.2f} ms  {per:6.1f} µs CPU/request",
                        flush=True,
                    )
                if round_:
                    for bound in bounds:
                        ratios[bound].append(rates[bound] / rates[bounds[0]])
            print(
                f"\n{'inline_run_us':>13} {'requests/s':>11} {'p99 ms':>7} {'CPU µs/req':>10} "
                f"{'vs first':>9}"
            )
            for bound in bounds:
                rows = figures[bound]
                print(
                    f"{bound:>13} {statistics.median(r for r, _, _ in rows):>11,.0f} "
                    f"{statistics.median(p for _, p, _ in rows):>7.2f} "
                    f"{statistics.median(c for _, _, c in rows):>10.1f} "
                    f"{statistics.median(ratios[bound]):>8.2f}x"
                )
        finally:
            for _, process in servers.values():
                process.terminate()
            for _, process in servers.values():
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
