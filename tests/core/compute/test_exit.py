"""Interpreter exit with sessions alive and runs in flight: no hang, no crash.

Each case (``tests/processes.py``'s ``EXIT_CASES``) runs in a fresh interpreter. The atexit
hook the Runtime registers at start cancels runs still in flight on daemon threads, waits for
them, and releases sessions; non-daemon threads are joined by Python before atexit hooks run,
as usual.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.processes import EXIT_CASES, run_exit_case

# Each case under each policy once; test_soak.py's 200 exits repeat the cases at volume.
_POLICIES = ["shared", "exclusive", "pool:2", "pool:3"]


@pytest.mark.timeout(600)
def test_twenty_exits_with_runs_in_flight_neither_hang_nor_crash():
    runs = [(case, policy) for case in EXIT_CASES for policy in _POLICIES]
    assert len(runs) == 20
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda r: run_exit_case(*r), runs))
    bad = [
        (name, code, err[-500:])
        for name, code, err in results
        if code != 0 or "Traceback" in err or "Fatal" in err
    ]
    assert not bad, bad
