"""The body budget: request bytes held at once, refused past it, given back when answered.

In-process: the budget itself, and the HTTP app through an ASGI transport. The real
server's figures (memory, other clients' latency, gRPC) are in
tests/reliability/test_bodies.py.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest

import corral.server.http.app
from corral import Host
from corral.protocol import DataPlane
from corral.server.bodies import BodyBudget, BodyBudgetExceeded
from corral.server.http.app import HttpApp
from corral.server.http.requests import DECODE_INLINE_BINARY_BYTES, DECODE_INLINE_BYTES
from corral.server.settings import ServerSettings

X = np.random.default_rng(7).standard_normal((2, 4)).astype(np.float32)
BODY = orjson.dumps(
    {"inputs": [{"name": "X", "datatype": "FP32", "shape": [2, 4], "data": X.ravel().tolist()}]}
)


@pytest.fixture
def host(repo: Path) -> Iterator[Host]:
    with Host(repo) as h:
        yield h


@pytest.fixture
def decoded_on(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of the thread each body the app decodes is decoded on, in order."""
    names: list[str] = []
    decode = corral.server.http.app.decode_request

    def recording(body: bytes, header_length: int | None, **options: Any) -> Any:
        names.append(threading.current_thread().name)
        return decode(body, header_length, **options)

    monkeypatch.setattr(corral.server.http.app, "decode_request", recording)
    return names


async def post(app: HttpApp, content: Any, **kwargs: Any) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://corral") as client:
        return await client.post("/v2/models/mlp/infer", content=content, **kwargs)


@pytest.mark.timeout(10)
def test_the_budget_holds_refuses_and_gives_back():
    budget = BodyBudget(100)
    first = budget.reserve(60)
    with pytest.raises(BodyBudgetExceeded, match=r"60 bytes .* 50 bytes .* budget of 100 bytes"):
        budget.reserve(50)
    assert budget.held == 60  # a refused reservation holds nothing
    with budget.reserve(40) as second:
        with pytest.raises(BodyBudgetExceeded):
            second.grow(1)
        assert (second.size, budget.held) == (40, 100)  # a refused growth keeps what it held
    assert budget.held == 60
    first.release()
    first.release()  # twice: nothing more given back
    assert budget.held == 0
    with pytest.raises(ValueError, match="positive number of bytes"):
        BodyBudget(0)


@pytest.mark.timeout(10)
def test_the_setting_defaults_to_four_requests_and_must_fit_one(tmp_path: Path):
    assert ServerSettings(repository=tmp_path, max_request_bytes=1000).body_budget_bytes() == 4000
    chosen = ServerSettings(repository=tmp_path, max_body_bytes_in_flight=10**9)
    assert chosen.body_budget_bytes() == 10**9
    with pytest.raises(ValueError, match=r"max_body_bytes_in_flight .* at least max_request_bytes"):
        ServerSettings(repository=tmp_path, max_request_bytes=1000, max_body_bytes_in_flight=999)


@pytest.mark.timeout(30)
def test_a_request_past_the_budget_gets_503_before_its_body_is_read(host: Host):
    budget = BodyBudget(len(BODY) + 10)
    app = HttpApp(DataPlane(host), body_budget=budget)
    streamed: list[str] = []

    async def body(label: str) -> AsyncIterator[bytes]:
        streamed.append(label)  # the ASGI transport reads the body only when the app does
        yield BODY

    async def go() -> tuple[httpx.Response, httpx.Response, httpx.Response]:
        with budget.reserve(20):  # another request holds part of the budget
            length = {"content-length": str(len(BODY))}
            refused = await post(app, body("declared"), headers=length)
            chunked_refused = await post(app, body("chunked"))
        return refused, chunked_refused, await post(app, BODY)

    refused, chunked_refused, answered = asyncio.run(go())
    assert refused.status_code == 503
    assert "declared" not in streamed
    assert refused.headers["retry-after"] == "1"
    assert "max_body_bytes_in_flight" in refused.json()["error"]
    assert f"budget of {len(BODY) + 10} bytes" in refused.json()["error"]
    # Without a Content-Length the body is counted as it comes, and refused when it passes.
    assert chunked_refused.status_code == 503
    assert streamed == ["chunked"]
    assert answered.status_code == 200
    assert budget.held == 0


@pytest.mark.timeout(30)
def test_large_json_parts_are_decoded_off_the_event_loop_and_binary_tensors_on_it(
    host: Host, decoded_on: list[str]
):
    budget = BodyBudget(8 * DECODE_INLINE_BINARY_BYTES)
    app = HttpApp(DataPlane(host), body_budget=budget)
    # The same tensor, padded with spaces past the threshold: JSON allows any amount.
    padded = BODY[:-1] + b" " * DECODE_INLINE_BYTES + b"}"

    # A binary tensor past the threshold behind a small JSON part: a view of the body, no
    # decoding by its size, so decoded on the loop; and one whose JSON part is past it.
    rows = np.random.default_rng(8).standard_normal((5000, 4)).astype(np.float32)
    assert rows.nbytes > DECODE_INLINE_BYTES
    tensor = {"name": "X", "datatype": "FP32", "shape": [5000, 4]}
    header = orjson.dumps({"inputs": [{**tensor, "parameters": {"binary_data_size": rows.nbytes}}]})
    long_header = header[:-1] + b" " * DECODE_INLINE_BYTES + b"}"
    binary = {"content-type": "application/octet-stream"}
    # Off the loop too: a binary body past DECODE_INLINE_BINARY_BYTES, and one whose JSON
    # part names a BYTES tensor (its elements are made one by one: 20 ms for 256 KiB of
    # empty strings), even spelled with an escape.
    many = np.zeros((DECODE_INLINE_BINARY_BYTES // 16 + 1, 4), np.float32)
    many_header = orjson.dumps(
        {
            "inputs": [
                {
                    **tensor,
                    "shape": list(many.shape),
                    "parameters": {"binary_data_size": many.nbytes},
                }
            ]
        }
    )
    strings = b"\0\0\0\0" * (DECODE_INLINE_BYTES // 4 + 1)
    count = len(strings) // 4

    def bytes_header(datatype: bytes) -> bytes:
        document = {
            "inputs": [
                {
                    "name": "X",
                    "datatype": "DATATYPE",
                    "shape": [count],
                    "parameters": {"binary_data_size": len(strings)},
                }
            ]
        }
        return orjson.dumps(document).replace(b"DATATYPE", datatype)

    def post_binary(head: bytes, tensors: bytes) -> Any:
        headers = {**binary, "inference-header-content-length": str(len(head))}
        return post(app, head + tensors, headers=headers)

    async def go() -> list[httpx.Response]:
        return [
            await post(app, BODY),
            await post(app, padded),
            await post(
                app,
                header + rows.tobytes(),
                headers={**binary, "inference-header-content-length": str(len(header))},
            ),
            await post(
                app,
                long_header + rows.tobytes(),
                headers={**binary, "inference-header-content-length": str(len(long_header))},
            ),
            await post_binary(many_header, many.tobytes()),
            await post_binary(bytes_header(b"BYTES"), strings),
            await post_binary(bytes_header(b"BYT\\u0045S"), strings),
        ]

    small, large, big_binary, long_binary, many_rows, named, escaped = asyncio.run(go())
    assert (small.status_code, large.status_code) == (200, 200)
    assert small.json()["outputs"] == large.json()["outputs"]
    assert (big_binary.status_code, long_binary.status_code) == (200, 200)
    assert big_binary.json()["outputs"] == long_binary.json()["outputs"]
    expected = host.infer("mlp", {"X": rows})["Y"]
    answered = big_binary.json()["outputs"][0]
    assert answered["shape"] == list(expected.shape)
    np.testing.assert_allclose(answered["data"], expected.ravel(), rtol=1e-6)
    assert many_rows.status_code == 200
    assert many_rows.json()["outputs"][0]["shape"] == [many.shape[0], expected.shape[1]]
    for refused in (named, escaped):  # the model's input is FP32: decoded, then refused
        assert refused.status_code == 400
        assert "input 'X'" in refused.json()["error"]
    main = threading.main_thread().name
    on_loop = [thread == main for thread in decoded_on]
    assert on_loop == [True, False, True, False, False, False, False], decoded_on
    assert budget.held == 0
