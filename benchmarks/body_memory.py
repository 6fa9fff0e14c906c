"""What decoding a request body of N bytes costs in memory: peak RSS growth per body byte.

Each case runs in a fresh interpreter: it builds one body, resets the process's peak RSS
(``/proc/self/clear_refs``, Linux), decodes the body with corral's HTTP decoder
(``corral.protocol.json.codec.decode_request``) and reports how far the peak rose above the
resident size before decoding, over the body's size. The body itself is not counted: it is
in memory before decoding starts. The server's end-to-end figure (reading the body too) is
``tests/reliability/test_bodies.py``'s.

Cases: JSON with one flat ``data`` array of short numbers (``1.0``, 4 bytes a number with
its comma) and of long ones (random FP32 values, about 12 bytes), the same short numbers
nested in rows of 100, and the binary tensor extension::

    python benchmarks/body_memory.py [--mib 40]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

CASES = ("json-flat-short", "json-flat-long", "json-nested-short", "binary")

_WORKER = """
import gc, json, re, sys
import numpy as np, orjson
from corral.protocol.json.codec import decode_request

def status(key):
    text = open("/proc/self/status").read()
    return int(re.search(key + r":\\s+(\\d+) kB", text)[1]) * 1024

case, size = sys.argv[1], int(sys.argv[2])
header_length = None
if case == "binary":
    values = (np.arange(size // 4) % 10).astype(np.float32)
    tensor = {"name": "x", "datatype": "FP32", "shape": [values.size],
              "parameters": {"binary_data_size": values.nbytes}}
    header = orjson.dumps({"inputs": [tensor]})
    body, header_length = header + values.tobytes(), len(header)
else:
    if case.endswith("long"):
        values = np.random.default_rng(0).random(size // 12, dtype=np.float32)
    else:
        values = (np.arange(size // 4) % 10).astype(np.float32)
    shape = [values.size]
    if case.startswith("json-nested"):
        values = values[: values.size // 100 * 100].reshape(-1, 100)
        shape = list(values.shape)
    tensor = {"name": "x", "datatype": "FP32", "shape": shape, "data": values}
    body = orjson.dumps({"inputs": [tensor]}, option=orjson.OPT_SERIALIZE_NUMPY)
del values, tensor
gc.collect()
open("/proc/self/clear_refs", "w").write("5")
before = status("VmRSS")
decoded = decode_request(body, header_length)
growth = status("VmHWM") - before
print(json.dumps({"case": case, "body_bytes": len(body), "peak_growth_bytes": growth}))
"""


def measure(case: str, size: int) -> dict[str, int | str]:
    """Run one case in a fresh interpreter; its body size and peak RSS growth in bytes."""
    root = str(Path(__file__).resolve().parents[1])
    done = subprocess.run(
        [sys.executable, "-c", _WORKER, case, str(size)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={"PYTHONPATH": root, "PATH": "/usr/bin:/bin"},
    )
    if done.returncode != 0:
        raise RuntimeError(f"case {case} failed:\n{done.stderr}")
    result: dict[str, int | str] = json.loads(done.stdout)
    return result


def format_row(result: dict[str, int | str]) -> str:
    """One table row: the case, the body's size, the peak growth and its multiple."""
    body = int(result["body_bytes"])
    growth = int(result["peak_growth_bytes"])
    return (
        f"| {result['case']} | {body / 2**20:.1f} MiB | {growth / 2**20:.1f} MiB "
        f"| {growth / body:.2f} x |"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Measure every case and print a Markdown table; return the exit code."""
    parser = argparse.ArgumentParser(prog="benchmarks/body_memory.py", description=__doc__)
    parser.add_argument("--mib", type=float, default=40.0, help="body size in MiB (40)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the results")
    args = parser.parse_args(argv)
    if not re.match(r"linux", sys.platform):
        print("body_memory: needs Linux (/proc/self/clear_refs)", file=sys.stderr)
        return 2
    size = int(args.mib * 2**20)
    print("| body | size | peak RSS growth while decoding | per body byte |")
    print("|---|---|---|---|")
    results = []
    for case in CASES:
        result = measure(case, size)
        results.append(result)
        print(format_row(result), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
