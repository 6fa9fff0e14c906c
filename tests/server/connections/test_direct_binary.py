"""Bodies over 64 KiB on the direct route: held in the body budget as they arrive.

An image's tensor, as tritonclient sends it (``Inference-Header-Content-Length``, no
compression) or as JSON, is answered directly up to ``DIRECT_HELD_BODY_BYTES``. These tests hold it
to what the ASGI path does with the same body: the same answer's bytes; its bytes counted in
the budget as they arrive and given back however the request ends (answered, timed out, the
client gone); a declared length that does not fit refused before the body is read (there by
the ASGI path itself); a budget that runs out mid-body answered 503, the rest dropped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import orjson
import pytest

from corral import Host
from corral.protocol import DataPlane
from corral.server.bodies import BodyBudget
from corral.server.connections.direct_route import (
    DIRECT_BODY_BYTES,
    DIRECT_HELD_BODY_BYTES,
    direct_body,
)
from corral.server.http.app import HttpApp
from tests.server.connections.test_direct_infer import (
    QUICK,
    Connection,
    Recording,
    both_ways,
    request,
)

pytestmark = pytest.mark.timeout(60)

ROWS = 5000  # 5,000 x 4 float32: 80,000 bytes, past DIRECT_BODY_BYTES
X = np.random.default_rng(5).standard_normal((ROWS, 4)).astype(np.float32)


def binary(x: np.ndarray) -> tuple[bytes, tuple[tuple[str, str], ...]]:
    """A binary request body for "mlp" and its header, as tritonclient writes them."""
    raw = x.astype("<f4").tobytes()
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "X",
                    "datatype": "FP32",
                    "shape": list(x.shape),
                    "parameters": {"binary_data_size": len(raw)},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    )
    return header + raw, (("Inference-Header-Content-Length", str(len(header))),)


BODY, HEADERS = binary(X)


@pytest.fixture
def host(repo: Path) -> Iterator[Host]:
    with Host(repo) as h:
        yield h


def test_the_heads_that_take_the_direct_route():
    small = [(b"content-length", b"100")]
    large = [(b"content-length", str(len(BODY)).encode())]
    header_length = [(b"inference-header-content-length", b"120")]
    assert len(BODY) > DIRECT_BODY_BYTES
    assert direct_body(small) == (100, False)
    assert direct_body(large + header_length) == (len(BODY), True)
    # A JSON body as large is held as it arrives too.
    assert direct_body(large) == (len(BODY), True)
    # Compressed, its JSON part's length given twice, too large, or a header that needs
    # the ASGI path: none of them.
    assert direct_body([*large, (b"content-encoding", b"gzip")]) is None
    assert direct_body([*large, *header_length, (b"content-encoding", b"gzip")]) is None
    assert direct_body(large + header_length * 2) is None
    too_large = [(b"content-length", str(DIRECT_HELD_BODY_BYTES + 1).encode())]
    assert direct_body(too_large + header_length) is None
    assert direct_body(too_large) is None
    assert direct_body([*small, (b"x-request-id", b"a")]) is None
    assert direct_body([(b"content-length", b"+10")]) is None


def test_a_large_binary_body_is_answered_directly_with_the_asgi_paths_bytes(host: Host):
    budget = BodyBudget(10 * len(BODY))
    app = HttpApp(DataPlane(host), body_budget=budget)
    [(status, headers, payload)], paths = asyncio.run(
        both_ways(app, request(BODY, headers=HEADERS))
    )
    assert paths == ["direct"]
    assert status == 200
    header_length = int(dict(headers)["inference-header-content-length"])
    answer = orjson.loads(payload[:header_length])
    [output] = answer["outputs"]
    assert output["shape"][0] == ROWS
    assert budget.held == 0


def held_midway_and_after(
    app: HttpApp, budget: BodyBudget, raw: bytes, body_length: int, midway: int
) -> tuple[int, int, int]:
    """``raw`` sent in two parts, ``midway`` bytes of its body first: what the budget held
    then, the answer's status, and what it held after the answer. Asserts the direct route."""
    head_length = len(raw) - body_length

    async def main() -> tuple[int, int, int]:
        recording = Recording(app)
        connection = Connection(recording)
        connection.send(raw[: head_length + midway])
        held = budget.held
        connection.send(raw[head_length + midway :])
        [(status, _, _)] = await connection.responses(1)
        await connection.close()
        assert recording.paths == ["direct"]
        return held, status, budget.held

    return asyncio.run(main())


# The same rows as JSON numbers: past DIRECT_BODY_BYTES, within DIRECT_HELD_BODY_BYTES.
JSON_ROWS = X[:1500]
JSON_BODY = orjson.dumps(
    {
        "inputs": [
            {
                "name": "X",
                "datatype": "FP32",
                "shape": [1500, 4],
                "data": JSON_ROWS.ravel().tolist(),
            }
        ]
    }
)


def test_a_json_body_of_numbers_is_answered_directly_held_as_it_arrives(host: Host):
    assert DIRECT_BODY_BYTES < len(JSON_BODY) <= DIRECT_HELD_BODY_BYTES
    budget = BodyBudget(10 * len(JSON_BODY))
    app = HttpApp(DataPlane(host), body_budget=budget)
    [(status, _, payload)], paths = asyncio.run(both_ways(app, request(JSON_BODY)))
    assert (paths, status) == (["direct"], 200)
    [output] = orjson.loads(payload)["outputs"]
    expected = host.infer("mlp", {"X": JSON_ROWS})["Y"]
    assert output["shape"] == list(expected.shape)
    np.testing.assert_allclose(output["data"], expected.ravel(), rtol=1e-6)
    assert held_midway_and_after(app, budget, request(JSON_BODY), len(JSON_BODY), 20_000) == (
        20_000,
        200,
        0,
    )


def test_a_large_binary_body_held_in_the_budget_as_it_arrives_and_given_back(host: Host):
    budget = BodyBudget(10 * len(BODY))
    app = HttpApp(DataPlane(host), body_budget=budget)
    raw = request(BODY, headers=HEADERS)
    held_midway, status, held_after = held_midway_and_after(app, budget, raw, len(BODY), 30_000)
    assert held_midway == 30_000  # what arrived, no more: the declared length is not held
    assert (status, held_after) == (200, 0)


def test_a_large_binary_body_that_stops_arriving_gets_408_and_gives_its_budget_back(host: Host):
    budget = BodyBudget(10 * len(BODY))
    app = HttpApp(DataPlane(host), body_budget=budget)
    raw = request(BODY, headers=HEADERS)

    async def main() -> tuple[int, int, int, bool]:
        connection = Connection(app, limits=QUICK)
        connection.send(raw[: len(raw) - len(BODY) + 1000])
        held = budget.held
        [(status, _, _)] = await connection.responses(1)
        await connection.close()
        return held, status, budget.held, connection.transport.closed

    held, status, held_after, closed = asyncio.run(main())
    assert (held, status, held_after, closed) == (1000, 408, 0, True)


def test_a_client_gone_mid_body_gives_its_budget_back(host: Host):
    budget = BodyBudget(10 * len(BODY))
    app = HttpApp(DataPlane(host), body_budget=budget)
    raw = request(BODY, headers=HEADERS)

    async def main() -> tuple[int, int]:
        connection = Connection(app)
        connection.send(raw[: len(raw) - 1000])
        held = budget.held
        connection.protocol.connection_lost(ConnectionResetError("gone"))
        await connection.close()
        return held, budget.held

    held, held_after = asyncio.run(main())
    assert (held, held_after) == (len(BODY) - 1000, 0)


def test_a_declared_length_past_the_budgets_room_is_refused_by_the_asgi_path(host: Host):
    budget = BodyBudget(len(BODY) - 1)
    app = HttpApp(DataPlane(host), body_budget=budget)
    [(status, headers, payload)], paths = asyncio.run(
        both_ways(app, request(BODY, headers=HEADERS))
    )
    assert paths == ["asgi"]
    assert status == 503
    assert ("retry-after", "1") in headers
    assert b"max_body_bytes_in_flight" in payload
    assert budget.refused == 2  # once per way: both_ways sends it twice
    assert budget.held == 0


def test_a_budget_that_runs_out_mid_body_answers_503_and_drops_the_rest(host: Host):
    budget = BodyBudget(len(BODY) + 100)
    app = HttpApp(DataPlane(host), body_budget=budget)
    raw = request(BODY, headers=HEADERS)
    head_length = len(raw) - len(BODY)

    async def main() -> tuple[int, list[tuple[str, str]], bytes, int, int]:
        recording = Recording(app)
        connection = Connection(recording)
        connection.send(raw[: head_length + 1000])  # the route taken: the whole body fitted
        other = budget.reserve(500)  # another request takes room meanwhile
        connection.send(raw[head_length + 1000 :])
        held_before_answer = budget.held
        [(status, headers, payload)] = await connection.responses(1)
        other.release()
        await connection.close()
        assert recording.paths == ["direct"]
        return status, headers, payload, held_before_answer, budget.held

    status, headers, payload, held_before_answer, held_after = asyncio.run(main())
    assert held_before_answer == 500  # the other request's: nothing of this body is kept
    assert status == 503
    assert ("retry-after", "1") in headers
    assert b"max_body_bytes_in_flight" in payload
    assert held_after == 0
    assert budget.refused == 1


def test_a_compressed_or_oversized_binary_body_takes_the_asgi_path(host: Host):
    app = HttpApp(DataPlane(host), body_budget=BodyBudget(64 * DIRECT_HELD_BODY_BYTES))
    many = np.ones((DIRECT_HELD_BODY_BYTES // 16 + 1, 4), np.float32)
    oversized, oversized_headers = binary(many)
    [(status, _, _)], paths = asyncio.run(
        both_ways(app, request(oversized, headers=oversized_headers))
    )
    assert (paths, status) == (["asgi"], 200)
