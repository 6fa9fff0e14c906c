"""Interpreter exit with sessions alive and runs in flight: no hang, no crash.

Each case runs in a fresh interpreter. The atexit hook the Runtime registers at start
cancels runs still in flight on daemon threads, waits for them, and releases sessions;
non-daemon threads are joined by Python before atexit hooks run, as usual.
"""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

_PRELUDE = """
import sys, threading
import numpy as np
import corral
from corral.testing import build_mlp
sys.path.insert(0, {root!r})
from tests.conftest import build_slow_loop

def forever(session, feed, started):
    started.set()
    try:
        while True:
            session.run(feed)
    except (corral.SessionClosed, corral.RunCancelled):
        pass  # the runtime shut down under us: the expected way out

def bounded(session, feed, started, n):
    started.set()
    for _ in range(n):
        session.run(feed)
"""

_CASES = {
    # Tiny model, daemon threads in tight loops, main falls off the end.
    "daemon-tight": """
s = corral.Session(build_mlp(), concurrency="{policy}")
feed = {{"X": np.ones((1, 4), np.float32)}}
events = [threading.Event() for _ in range(4)]
for e in events:
    threading.Thread(target=forever, args=(s, feed, e), daemon=True).start()
for e in events:
    e.wait(30)
""",
    # An endless Loop model in flight on daemon threads: exit must cancel it.
    "daemon-endless": """
s = corral.Session(build_slow_loop(), concurrency="{policy}")
feed = {{"M": np.array(10**12, np.int64), "start": np.zeros(1, np.float32)}}
events = [threading.Event() for _ in range(2)]
for e in events:
    threading.Thread(target=forever, args=(s, feed, e), daemon=True).start()
for e in events:
    e.wait(30)
""",
    # Non-daemon threads still running bounded loops when main returns.
    "non-daemon": """
s = corral.Session(build_mlp(), concurrency="{policy}")
feed = {{"X": np.ones((1, 4), np.float32)}}
events = [threading.Event() for _ in range(3)]
for e in events:
    threading.Thread(target=bounded, args=(s, feed, e, 2000)).start()
for e in events:
    e.wait(30)
""",
    # A Host whose requests are queued for, and running on, the compute workers at exit.
    "host-queued": """
import tempfile, pathlib
root = pathlib.Path(tempfile.mkdtemp())
(root / "m" / "1").mkdir(parents=True)
(root / "m" / "1" / "model.onnx").write_bytes(build_mlp())
(root / "m" / "model.toml").write_text('concurrency = "{policy}"\\n')
host = corral.Host(root)
host.infer("m", {{"X": np.ones((1, 4), np.float32)}})

def submitter(started):
    started.set()
    try:
        while True:
            host.submit("m", {{"X": np.ones((1, 4), np.float32)}}).result()
    except (corral.CorralError, RuntimeError):
        pass  # the runtime shut down under us: the expected way out

events = [threading.Event() for _ in range(3)]
for e in events:
    threading.Thread(target=submitter, args=(e,), daemon=True).start()
for e in events:
    e.wait(30)
""",
    # sys.exit from main with many sessions alive and runs in flight.
    "sys-exit": """
sessions = [corral.Session(build_mlp(seed=i), concurrency="{policy}") for i in range(50)]
feed = {{"X": np.ones((1, 4), np.float32)}}
events = [threading.Event() for _ in range(4)]
for i, e in enumerate(events):
    threading.Thread(target=forever, args=(sessions[i], feed, e), daemon=True).start()
for e in events:
    e.wait(30)
sys.exit(0)
""",
}

_POLICIES = ["shared", "exclusive", "pool:2", "shared", "pool:3"]


def _exit_once(case: str, policy: str) -> tuple[str, int | None, str]:
    root = str(__import__("pathlib").Path(__file__).resolve().parents[1])
    script = _PRELUDE.format(root=root) + _CASES[case].format(policy=policy)
    try:
        result = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        return f"{case}/{policy}", None, "hung: no exit within 60 s"
    return f"{case}/{policy}", result.returncode, result.stderr


@pytest.mark.timeout(600)
def test_twenty_five_exits_with_runs_in_flight_neither_hang_nor_crash():
    runs = [(case, policy) for case in _CASES for policy in _POLICIES]
    assert len(runs) == 25
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda r: _exit_once(*r), runs))
    bad = [
        (name, code, err[-500:])
        for name, code, err in results
        if code != 0 or "Traceback" in err or "Fatal" in err
    ]
    assert not bad, bad
