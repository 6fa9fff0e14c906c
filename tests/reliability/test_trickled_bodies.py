"""Bodies held to progress, not only to silence, on a real ``corral serve`` process, both edges.

The attack: a few connections send the start of a body at once (what they then hold of the
body budget) and then one byte every 0.2 s, which is never a silence of ``body_timeout_s``.
Held only to silence, they kept the budget for as long as they trickled and every other
request with a body got 503. Held to ``body_min_rate_bytes_s`` over each ``body_timeout_s``
window, they are cut with 408 within two windows and their bytes given back.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from corral.testing import build_mlp
from tests.attacks import Trickler, status_of
from tests.helpers import Figure, add_model
from tests.processes import ServerProcess, start_server, stop_server

BODY_TIMEOUT_S = 1.0
# Four bodies of 80 KiB: past the 64 KiB the Python edge keeps whole before it holds them in
# the budget (a body that large is held as its bytes arrive, on either edge).
BODY = 80 * 1024
# Room for the four bodies' first parts and 128 bytes: not for SMALL.
BUDGET = 4 * BODY + 64
SMALL = orjson.dumps(
    {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}
).ljust(256)
EDGES = [
    "python",
    pytest.param(
        "native",
        marks=pytest.mark.skipif(
            importlib.util.find_spec("corral_edge") is None, reason="corral_edge is not built"
        ),
    ),
]


def serve(tmp_path: Path, edge: str, *extra: str) -> ServerProcess:
    """A server with a 320 KiB body budget and a 1 s body timeout, on ``edge``."""
    repo = tmp_path / "models"
    add_model(repo, "mlp", build_mlp(n_features=4, seed=3))
    return start_server(
        repo,
        tmp_path / "serve.log",
        "--max-request-bytes",
        str(BUDGET),
        "--max-body-bytes-in-flight",
        str(BUDGET),
        "--body-timeout-s",
        str(BODY_TIMEOUT_S),
        *extra,
        environment={"CORRAL_EDGE": edge},
    )


@pytest.fixture(params=EDGES)
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ServerProcess]:
    served = serve(tmp_path, request.param)
    try:
        yield served
    finally:
        stop_server(served)


def wait_for(condition: Callable[[], bool], timeout: float) -> bool:
    """Poll ``condition()`` every 20 ms until it holds or ``timeout`` passes; whether it held."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "content-length"])
def test_trickled_bodies_are_cut_with_408_and_give_the_budget_back(
    server: ServerProcess, chunked: bool, figure: Figure
):
    host, port = server.http.split(":")
    # Four bodies sent at once but for their last 80 bytes (the whole budget less 128 bytes:
    # no room for a small request), then a byte every 0.2 s: 5 bytes/s, never silent for 1 s,
    # and 16 s from complete.
    first = BODY - 16
    announced = BODY + 64  # each fits the budget's room when it comes (it is checked)
    with (
        httpx.Client(base_url=f"http://{server.http}", timeout=30) as client,
        Trickler(
            (host, int(port)), 4, first=first, chunked=chunked, announced=announced
        ) as trickled,
    ):

        def refused() -> bool:
            return client.post("/v2/models/mlp/infer", content=SMALL).status_code == 503

        assert wait_for(refused, 10), "the trickled bodies never filled the budget"
        # Held to silence only they would trickle on for as long as they liked: 10 s here.
        assert wait_for(trickled.all_closed, 10), (
            f"trickled bodies still open after 10 s: {trickled.closed_after}"
        )
        after = client.post("/v2/models/mlp/infer", content=SMALL)
    statuses = [status_of(answer or b"") for answer in trickled.answers]
    slowest = max(after_s or 0.0 for after_s in trickled.closed_after)
    figure(
        f"4 bodies trickled at 5 bytes/s after 80 KiB ({'chunked' if chunked else 'length'}, "
        f"--body-timeout-s {BODY_TIMEOUT_S:g}): cut after",
        f"{slowest:.2f} s with {statuses}, then a request {after.status_code}",
    )
    assert statuses == [408] * 4, trickled.answers
    assert all(b"body_min_rate_bytes_s" in (answer or b"") for answer in trickled.answers)
    # The first window (80 KiB) keeps the rate; the second (5 bytes) does not.
    assert slowest < 2 * BODY_TIMEOUT_S + 1.5
    assert after.status_code == 200, after.text[:300]
