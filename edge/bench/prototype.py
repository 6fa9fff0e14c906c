"""How much the native edge and the Python hand-off cost: wrk against the tiny model.

The Edge (one tokio thread) and a Python thread that takes each group of calls and answers it
with one numpy matmul (Y = X @ W, X [-1, 4] FP32), in this process; wrk (16 connections,
10 s, a JSON POST) in another. Prints requests/s and this process's CPU time per request
(user + system, from psutil), and how many calls Python took per group.

Usage: python edge/bench/prototype.py [--seconds 10] [--connections 16] [--threads 1] [--onnx]

For scale: NVIDIA Triton does about 20k req/s at about 53 us of CPU per request on this load
on the project's 2-core machine; the goal is 1.5x its throughput at 0.67x its CPU per request.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE.parents[1]))

import numpy as np  # noqa: E402
import psutil  # noqa: E402

from harness import Bridges, Server  # noqa: E402

BODY = json.dumps(
    {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4], "data": [0.1, 0.2, 0.3, 0.4]}]}
)
LUA = f"""
wrk.method = "POST"
wrk.body = '{BODY}'
wrk.headers["Content-Type"] = "application/json"
"""


def onnx_handler():
    """Answers with onnxruntime on corral's test MLP instead of numpy (--onnx)."""
    import onnxruntime as ort
    from corral.testing import build_mlp

    path = Path(tempfile.mkdtemp()) / "mlp.onnx"
    model = build_mlp()
    path.write_bytes(model.SerializeToString() if hasattr(model, "SerializeToString") else model)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    input_name = session.get_inputs()[0].name
    output_name = session.get_outputs()[0].name

    def handle(group):
        arrays = [np.frombuffer(c.inputs[0], dtype=np.float32).reshape(c.inputs[0].shape) for c in group.calls]
        rows = session.run([output_name], {input_name: np.concatenate(arrays)})[0]
        start = 0
        for call, array in zip(group.calls, arrays):
            y = np.ascontiguousarray(rows[start : start + array.shape[0]])
            start += array.shape[0]
            call.answer(group.model, group.version, [(output_name, "FP32", y.shape, y)])

    return handle


def _io() -> dict[str, int]:
    """This process's I/O counters: syscr and syscw count read and write system calls."""
    fields = {}
    for line in Path("/proc/self/io").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = int(value)
    return fields


def _thread_times() -> dict[int, tuple[str, float, float]]:
    """Each thread's name (its comm) and CPU seconds, from /proc/self/task."""
    ticks = os.sysconf("SC_CLK_TCK")
    times = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        times[int(task.name)] = (name, int(fields[11]) / ticks, int(fields[12]) / ticks)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1, help="the edge's tokio threads")
    parser.add_argument("--wrk-threads", type=int, default=2)
    parser.add_argument("--onnx", action="store_true")
    args = parser.parse_args()

    bridges = Bridges()
    bridges.start()
    handlers = {"tiny": onnx_handler()} if args.onnx else None
    server = Server(bridges, handlers=handlers, threads=args.threads).start()
    url = f"http://127.0.0.1:{server.http_port}/v2/models/tiny/infer"
    script = Path(tempfile.mkdtemp()) / "post.lua"
    script.write_text(LUA)
    # Warm up (and check the answer).
    subprocess.run(["wrk", "-t1", "-c4", "-d1s", "-s", str(script), url], capture_output=True, check=True)
    process = psutil.Process(os.getpid())
    before = process.cpu_times()
    threads_before = _thread_times()
    io_before = _io()
    groups_before, calls_before = server.taker.groups, server.taker.calls
    started = time.perf_counter()
    result = subprocess.run(
        ["wrk", f"-t{args.wrk_threads}", f"-c{args.connections}", f"-d{args.seconds}s", "--latency",
         "-s", str(script), url],
        capture_output=True, text=True, check=True,
    )
    elapsed = time.perf_counter() - started
    after = process.cpu_times()
    threads_after = _thread_times()
    io_after = _io()
    groups = server.taker.groups - groups_before
    calls = server.taker.calls - calls_before
    stats = server.edge.stats()
    server.stop()
    bridges.stop()
    requests = int(re.search(r"(\d+) requests in", result.stdout).group(1))
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", result.stdout)
    cpu = (after.user - before.user) + (after.system - before.system)
    print(result.stdout)
    print(f"requests/s            {requests / elapsed:,.0f}")
    print(f"server CPU us/request {cpu / requests * 1e6:.1f}  (user {(after.user - before.user) / requests * 1e6:.1f}, "
          f"system {(after.system - before.system) / requests * 1e6:.1f})")
    print(f"calls per group       {calls / max(groups, 1):.2f}  ({groups} groups)")
    by_name: dict[str, tuple[float, float]] = {}
    for tid, (name, user, system) in threads_after.items():
        _, user_before, system_before = threads_before.get(tid, (name, 0.0, 0.0))
        total = by_name.get(name, (0.0, 0.0))
        by_name[name] = (total[0] + user - user_before, total[1] + system - system_before)
    shown = ", ".join(
        f"{name} {(u + s) / requests * 1e6:.1f} (user {u / requests * 1e6:.1f})"
        for name, (u, s) in sorted(by_name.items(), key=lambda kv: -sum(kv[1]))
        if u + s > 0
    )
    print(f"CPU us/request by thread  {shown}")
    print(f"syscalls/request      read-like {(io_after['syscr'] - io_before['syscr']) / requests:.2f}, "
          f"write-like {(io_after['syscw'] - io_before['syscw']) / requests:.2f}")
    print(f"non-2xx               {errors.group(1) if errors else 0}")
    print(f"edge stats            {stats}")


if __name__ == "__main__":
    main()
