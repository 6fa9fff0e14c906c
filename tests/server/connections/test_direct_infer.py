"""Inference requests answered directly by corral serve's connections, without the ASGI path.

``EdgeProtocol`` hands the plainest ``POST /v2/models/{name}/infer`` to
``HttpApp.answer_infer`` from the parser's callbacks. These tests feed raw HTTP bytes to the
protocol in-process (a fake transport, no socket) and hold it to three things:

- the answers are byte for byte those of the ASGI path, for good requests, every kind of
  refusal and generated nearly-right requests (the same bytes fed to a protocol without the
  direct path);
- the requests that need what only the ASGI path does (a query, an escape, a version,
  HTTP/1.0, ``Expect``, a chunked or large body, ``X-Request-ID``) take it;
- a direct request keeps HTTP's order and the connection's life: what is pipelined behind it
  waits for its answer, a client gone gets nothing, the drain closes the connection after it
  and answers it 503 when the drain runs out, a paused writer is waited for.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from uvicorn.config import Config
from uvicorn.server import ServerState

from corral import Host
from corral._host.served import ServedVersion
from corral.protocol import DataPlane
from corral.server.bodies import BodyBudget
from corral.server.connections.contract import ConnectionLimits
from corral.server.connections.direct_route import DIRECT_HELD_BODY_BYTES
from corral.server.connections.edge import EdgeProtocol, end_requests_in_flight, protocol_for
from corral.server.http.app import HttpApp
from corral.testing import build_mlp
from tests.gates import lane_settled
from tests.helpers import FakeTransport, reference_run
from tests.strategies import plausible_requests

LIMITS = ConnectionLimits(
    max_url_bytes=8192,
    max_header_bytes=65536,
    header_timeout_s=5.0,
    idle_timeout_s=30.0,
    max_connections=100,
    body_timeout_s=30.0,
)
TIMEOUT_S = 10.0
X = np.random.default_rng(11).standard_normal((2, 4)).astype(np.float32)
PLAIN = orjson.dumps(
    {"inputs": [{"name": "X", "datatype": "FP32", "shape": [2, 4], "data": X.ravel().tolist()}]}
)

Response = tuple[int, list[tuple[str, str]], bytes]


def parse(data: bytes) -> list[Response]:
    """The complete responses in ``data``: status, headers (date dropped) and body each."""
    responses: list[Response] = []
    rest = bytes(data)
    while b"\r\n\r\n" in rest:
        head, rest = rest.split(b"\r\n\r\n", 1)
        status_line, *lines = head.decode("latin-1").split("\r\n")
        status = int(status_line.split()[1])
        if status == 100:
            continue
        headers = [(k.lower(), v) for k, v in (line.split(": ", 1) for line in lines)]
        length = int(dict(headers).get("content-length", "0"))
        if len(rest) < length:
            break
        body, rest = rest[:length], rest[length:]
        responses.append((status, [h for h in headers if h[0] != "date"], body))
    return responses


def request(
    body: bytes = PLAIN,
    path: str = "/v2/models/mlp/infer",
    *,
    method: str = "POST",
    version: str = "1.1",
    headers: tuple[tuple[str, str], ...] = (("Content-Type", "application/json"),),
    chunked: bool = False,
) -> bytes:
    """One HTTP request's bytes."""
    lines = [f"{method} {path} HTTP/{version}", "Host: corral"]
    lines += [f"{name}: {value}" for name, value in headers]
    if chunked:
        lines.append("Transfer-Encoding: chunked")
        framed = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    else:
        lines.append(f"Content-Length: {len(body)}")
        framed = body
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + framed


class Recording:
    """An app in front of ``app`` that notes which path each request took."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.paths: list[str] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.paths.append("asgi")
        await self.app(scope, receive, send)

    async def answer_infer(self, *args: Any, **kwargs: Any) -> tuple[int, bytes, bytes]:
        self.paths.append("direct")
        answer: tuple[int, bytes, bytes] = await self.app.answer_infer(*args, **kwargs)
        return answer

    def hold_body(self, declared: int) -> Any:
        return self.app.hold_body(declared)


class Connection:
    """One protocol instance on a fake transport, fed bytes as a client sends them."""

    def __init__(
        self,
        app: Any,
        *,
        direct: bool = True,
        limits: ConnectionLimits = LIMITS,
        state: ServerState | None = None,
    ) -> None:
        # A server's connections share its state: its connections and its tasks.
        self.state = state or ServerState()
        config = Config(app, lifespan="off", ws="none", log_config=None)
        config.load()
        cls = protocol_for(limits, app if direct else None)
        self.protocol: EdgeProtocol = cls(config, self.state, {}, asyncio.get_running_loop())
        self.transport = FakeTransport()
        self.protocol.connection_made(self.transport)  # type: ignore[arg-type]

    def send(self, data: bytes) -> None:
        self.protocol.data_received(data)

    async def responses(self, count: int) -> list[Response]:
        """Wait until ``count`` responses are complete (or the connection closed)."""
        async with asyncio.timeout(TIMEOUT_S):
            while len(parse(self.transport.data)) < count and not self.transport.closed:
                self.transport.changed.clear()
                await self.transport.changed.wait()
        return parse(self.transport.data)

    async def close(self) -> None:
        self.protocol.connection_lost(None)
        async with asyncio.timeout(TIMEOUT_S):
            while self.state.tasks:
                await asyncio.gather(*self.state.tasks, return_exceptions=True)
                # Since Python 3.12, gathering tasks that have all finished returns without
                # yielding to the loop, so the callbacks that take them out of the set
                # (scheduled when they finished) would never run: one turn of the loop.
                await asyncio.sleep(0)


@pytest.fixture
def host(repo: Path) -> Iterator[Host]:
    with Host(repo) as h:
        yield h


async def both_ways(app: HttpApp, raw: bytes, count: int = 1) -> tuple[list[Response], list[str]]:
    """The responses to ``raw`` with the direct path, checked equal to those without it."""
    recording = Recording(app)
    direct = Connection(recording)
    direct.send(raw)
    answered = await direct.responses(count)
    await direct.close()
    asgi = Connection(Recording(app), direct=False)
    asgi.send(raw)
    expected = await asgi.responses(count)
    await asgi.close()
    assert answered == expected
    assert len(answered) == count
    return answered, recording.paths


def gzipped(body: bytes) -> bytes:
    return gzip.compress(body)


BINARY_HEADER = orjson.dumps(
    {
        "inputs": [
            {
                "name": "X",
                "datatype": "FP32",
                "shape": [2, 4],
                "parameters": {"binary_data_size": 32},
            }
        ],
        "parameters": {"binary_data_output": True},
    }
)

# Requests answered directly: (body, extra headers, the status expected).
DIRECT_CASES = {
    "json": (PLAIN, (), 200),
    "binary": (
        BINARY_HEADER + X.astype("<f4").tobytes(),
        (("Inference-Header-Content-Length", str(len(BINARY_HEADER))),),
        200,
    ),
    "gzip both ways": (
        gzipped(PLAIN),
        (("Content-Encoding", "gzip"), ("Accept-Encoding", "gzip")),
        200,
    ),
    "not JSON": (b"{nope", (), 400),
    "wrong datatype": (PLAIN.replace(b"FP32", b"INT8"), (), 400),
    "unknown coding": (PLAIN, (("Content-Encoding", "br"),), 415),
    "bad header length": (PLAIN, (("Inference-Header-Content-Length", "-3"),), 400),
    "connection close": (PLAIN, (("Connection", "close"),), 200),
}


@pytest.mark.parametrize("case", list(DIRECT_CASES))
def test_a_plain_request_is_answered_directly_with_the_asgi_paths_bytes(host: Host, case: str):
    body, headers, status = DIRECT_CASES[case]
    app = HttpApp(DataPlane(host))

    async def main() -> tuple[list[Response], list[str]]:
        return await both_ways(app, request(body, headers=headers))

    [(answered, answer_headers, _)], paths = asyncio.run(main())
    assert paths == ["direct"]
    assert answered == status
    if case == "connection close":
        assert ("connection", "close") in answer_headers


def test_an_unknown_model_is_answered_directly_404(host: Host):
    app = HttpApp(DataPlane(host))
    [(status, _, body)], paths = asyncio.run(both_ways(app, request(path="/v2/models/nope/infer")))
    assert paths == ["direct"]
    assert (status, b"nope" in body) == (404, True)


def test_tokens_limits_and_the_body_budget_answer_directly_as_the_asgi_path_does(host: Host):
    plane = DataPlane(host)
    guarded = HttpApp(plane, auth_token="s3cret")
    small = HttpApp(plane, max_request_bytes=64)
    starved = HttpApp(plane, body_budget=BodyBudget(16))

    async def main() -> list[tuple[int, list[tuple[str, str]]]]:
        seen = []
        for app, headers in (
            (guarded, ()),
            (guarded, (("Authorization", "Bearer wrong"),)),
            (guarded, (("Authorization", "Bearer s3cret"),)),
            (small, ()),
            (starved, ()),
        ):
            [(status, answer_headers, _)], paths = await both_ways(app, request(headers=headers))
            assert paths == ["direct"]
            seen.append((status, answer_headers))
        return seen

    seen = asyncio.run(main())
    assert [status for status, _ in seen] == [401, 401, 200, 413, 503]
    assert ("www-authenticate", "Bearer") in seen[0][1]
    assert ("retry-after", "1") in seen[4][1]


def test_an_unexpected_error_is_logged_and_answered_500_directly(
    host: Host, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    app = HttpApp(DataPlane(host))

    async def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the plane broke")

    monkeypatch.setattr(DataPlane, "infer", broken)
    with caplog.at_level(logging.ERROR, logger="corral.server.http.responses"):
        [(status, _, body)], paths = asyncio.run(both_ways(app, request()))
    assert paths == ["direct"]
    assert status == 500
    assert b"the plane broke" in body
    failures = [r for r in caplog.records if "POST /v2/models/mlp/infer failed" in r.message]
    assert len(failures) == 2  # once per path, each with its traceback
    assert all(r.exc_info is not None for r in failures)


BIG = orjson.dumps(
    {
        "inputs": [
            {
                "name": "X",
                "datatype": "FP32",
                "shape": [70000, 4],
                "data": np.ones(4 * 70000, np.float32).tolist(),
            }
        ]
    }
)

# Requests that take the ASGI path: raw bytes.
ASGI_CASES = {
    "query string": request(path="/v2/models/mlp/infer?x=1"),
    "escaped name": request(path="/v2/models/ml%70/infer"),
    "fragment": request(path="/v2/models/mlp#x/infer"),
    "version": request(path="/v2/models/mlp/versions/1/infer"),
    "HTTP/1.0": request(version="1.0"),
    "request id": request(headers=(("X-Request-ID", "abc-1"),)),
    "expect": request(headers=(("Expect", "100-continue"),)),
    "chunked": request(chunked=True),
    "GET": request(method="GET", body=b""),
    "large body": request(BIG),
}


@pytest.mark.parametrize("case", list(ASGI_CASES))
def test_a_request_that_needs_the_asgi_path_takes_it(host: Host, case: str):
    if case == "large body":
        assert len(BIG) > DIRECT_HELD_BODY_BYTES
    app = HttpApp(DataPlane(host))
    [(status, headers, _)], paths = asyncio.run(both_ways(app, ASGI_CASES[case]))
    assert paths == ["asgi"]
    assert status == (405 if case in ("GET", "fragment") else 200)
    if case == "request id":
        assert ("x-request-id", "abc-1") in headers


def test_with_the_access_log_on_the_app_answers_nothing_directly(host: Host):
    plane = DataPlane(host)
    assert HttpApp(plane).answers_directly
    assert not HttpApp(plane, access_log=True).answers_directly


def test_requests_pipelined_around_direct_ones_are_answered_in_order(host: Host):
    app = HttpApp(DataPlane(host))
    raw = b"".join(
        (
            request(),
            request(method="GET", path="/v2/models/mlp", body=b""),
            request(PLAIN.replace(b"FP32", b"INT8")),
            request(headers=(("X-Request-ID", "last"),)),
        )
    )
    answers, paths = asyncio.run(both_ways(app, raw, count=4))
    assert [status for status, _, _ in answers] == [200, 200, 400, 200]
    assert b'"platform"' in answers[1][2]
    assert ("x-request-id", "last") in answers[3][1]
    assert paths[0] == "direct"  # the rest were pipelined behind it: uvicorn queued them


class Gated:
    """A stand-in app: its direct answers wait for ``gate``; ASGI requests are answered at once."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.started = asyncio.Event()
        self.paths: list[str] = []
        self.alone: list[bool] = []  # what each direct request was told

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        self.paths.append("asgi")
        while (await receive()).get("more_body"):
            pass
        headers = [(b"content-type", b"text/plain"), (b"content-length", b"4")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"asgi"})

    async def answer_infer(
        self,
        name: str,
        headers: object,
        body: bytes,
        loop: object,
        alone: bool = False,
        **held: object,
    ) -> tuple[int, bytes, bytes]:
        self.paths.append("direct")
        self.alone.append(alone)
        self.started.set()
        await self.gate.wait()
        payload = b"direct:" + name.encode()
        return 200, b"content-type: text/plain\r\ncontent-length: %d\r\n" % len(payload), payload


async def held_direct_request() -> tuple[Gated, Connection]:
    """A connection whose direct request for model "a" is being answered, held at the gate."""
    app = Gated()
    connection = Connection(app)
    connection.send(request(path="/v2/models/a/infer"))
    async with asyncio.timeout(TIMEOUT_S):
        await app.started.wait()
    return app, connection


async def answered_then_closed(connection: Connection) -> None:
    """Check that the held request was answered with ``Connection: close``, then closed."""
    [(status, headers, body)] = await connection.responses(1)
    assert (status, body) == (200, b"direct:a")
    assert ("connection", "close") in headers
    assert connection.transport.closed
    await connection.close()


async def _yield_to_the_loop(turns: int = 20) -> None:
    # Lets every ready callback and task run; no time passes on any clock that matters.
    for _ in range(turns):
        await asyncio.sleep(0)


def test_a_request_pipelined_behind_a_direct_one_waits_for_its_answer():
    async def main() -> None:
        app = Gated()
        connection = Connection(app)
        connection.send(request(path="/v2/models/a/infer") + request(path="/v2/models/b/infer"))
        async with asyncio.timeout(TIMEOUT_S):
            await app.started.wait()
        await _yield_to_the_loop()
        assert app.paths == ["direct"]  # the second waits behind the first
        assert connection.transport.data == b""
        app.gate.set()
        answers = await connection.responses(2)
        assert [body for _, _, body in answers] == [b"direct:a", b"asgi"]
        await connection.close()

    asyncio.run(main())


GARBAGE = b"\x00\x01 not HTTP at all\r\n\r\n"


def test_garbage_behind_a_request_in_progress_ends_the_connection_after_its_answer(
    caplog: pytest.LogCaptureFixture,
):
    async def main() -> None:
        app, connection = await held_direct_request()
        with caplog.at_level(logging.WARNING, logger="corral.server.connections.edge"):
            connection.send(GARBAGE)
        assert connection.transport.data == b""  # no 400 ahead of the answer in progress
        app.gate.set()
        await answered_then_closed(connection)

    asyncio.run(main())
    [record] = [r for r in caplog.records if "invalid HTTP request" in r.message]
    assert "answered 400" not in record.message
    assert "the request before it is answered, then the connection closes" in record.message


def test_garbage_on_an_idle_connection_is_answered_400_and_logged_so(
    caplog: pytest.LogCaptureFixture,
):
    async def main() -> list[Response]:
        connection = Connection(Gated())
        with caplog.at_level(logging.WARNING, logger="corral.server.connections.edge"):
            connection.send(GARBAGE)
        answers = await connection.responses(1)
        assert connection.transport.closed
        await connection.close()
        return answers

    [(status, _, body)] = asyncio.run(main())
    assert (status, b"not valid HTTP/1.1" in body) == (400, True)
    [record] = [r for r in caplog.records if "invalid HTTP request" in r.message]
    assert record.message.endswith("answered 400")


def test_a_client_gone_during_a_direct_request_is_written_nothing():
    async def main() -> None:
        app, connection = await held_direct_request()
        connection.protocol.connection_lost(ConnectionResetError("gone"))
        app.gate.set()
        await connection.close()  # waits for the request's task
        assert connection.transport.data == b""

    asyncio.run(main())


def test_the_drain_answers_a_direct_request_and_closes_the_connection_after_it():
    async def main() -> None:
        app, connection = await held_direct_request()
        connection.protocol.shutdown()
        app.gate.set()
        await answered_then_closed(connection)

    asyncio.run(main())


def test_the_drain_answers_a_direct_request_whose_body_is_still_arriving():
    async def main() -> None:
        app = Gated()
        app.gate.set()
        connection = Connection(app)
        raw = request(path="/v2/models/a/infer", body=b"0123456789")
        connection.send(raw[:-4])  # the head and part of the body
        connection.protocol.shutdown()
        idle_check = connection.protocol.close_if_idle  # what the drain's timer calls
        idle_check()
        assert not connection.transport.closed
        connection.send(raw[-4:])
        await answered_then_closed(connection)

    asyncio.run(main())


def test_a_drain_that_runs_out_answers_a_direct_request_503():
    async def main() -> None:
        _, connection = await held_direct_request()
        assert end_requests_in_flight(connection.state) == 1
        [(status, headers, body)] = await connection.responses(1)
        assert status == 503
        assert b"drain timeout ran out" in body
        assert ("connection", "close") in headers
        await connection.close()

    asyncio.run(main())


def test_a_direct_request_cancelled_outside_the_drain_is_not_answered():
    async def main() -> None:
        _, connection = await held_direct_request()
        (task,) = connection.state.tasks
        task.cancel()
        await connection.close()
        assert task.cancelled()
        assert connection.transport.data == b""

    asyncio.run(main())


def test_a_direct_answer_waits_while_the_transport_asks_to_pause_writing():
    async def main() -> None:
        app, connection = await held_direct_request()
        connection.protocol.pause_writing()
        app.gate.set()
        await _yield_to_the_loop()
        assert connection.transport.data == b""
        connection.protocol.resume_writing()
        [(status, _, body)] = await connection.responses(1)
        assert (status, body) == (200, b"direct:a")
        await connection.close()

    asyncio.run(main())


def test_keep_alive_serves_direct_requests_one_after_another(host: Host):
    app = HttpApp(DataPlane(host))

    async def main() -> list[str]:
        recording = Recording(app)
        connection = Connection(recording)
        for count in (1, 2, 3):
            connection.send(request())
            answers = await connection.responses(count)
        assert [status for status, _, _ in answers] == [200, 200, 200]
        assert not connection.transport.closed
        await connection.close()
        return recording.paths

    assert asyncio.run(main()) == ["direct"] * 3


@given(
    case=plausible_requests(names=("X", "x"), outputs=("Y", "Z")),
    coding=st.sampled_from([None, "gzip", "br"]),
    accept=st.sampled_from([None, "gzip", "identity", "deflate;q=0, gzip"]),
)
@settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
def test_nearly_right_requests_get_the_asgi_paths_answers_directly(
    host: Host, case: tuple[bytes, int | None], coding: str | None, accept: str | None
):
    body, header_length = case
    headers: list[tuple[str, str]] = [
        ("Content-Type", "application/json" if header_length is None else "application/x")
    ]
    if header_length is not None:
        headers.append(("Inference-Header-Content-Length", str(header_length)))
    if coding is not None:
        headers.append(("Content-Encoding", coding))
        body = gzipped(body) if coding == "gzip" else body
    if accept is not None:
        headers.append(("Accept-Encoding", accept))
    app = HttpApp(DataPlane(host))
    [(status, _, _)], paths = asyncio.run(both_ways(app, request(body, headers=tuple(headers))))
    assert paths == ["direct"]
    assert status < 500


# -- the inline lane takes a request only when it is alone ---------------------------------


def test_a_direct_request_is_told_alone_only_when_no_other_of_the_server_is_in_flight():
    async def main() -> None:
        app = Gated()
        first = Connection(app)
        second = Connection(app, state=first.state)
        first.send(request(path="/v2/models/a/infer"))
        async with asyncio.timeout(TIMEOUT_S):
            await app.started.wait()
        second.send(request(path="/v2/models/a/infer"))  # while the first is in flight
        await _yield_to_the_loop()
        assert app.alone == [True, False]
        app.gate.set()
        for connection in (first, second):
            assert len(await connection.responses(1)) == 1
        await _yield_to_the_loop()  # the tasks' done callbacks leave the server's set
        # Two arriving in one turn of the loop: both are counted before either runs.
        first.send(request(path="/v2/models/a/infer"))
        second.send(request(path="/v2/models/a/infer"))
        for connection in (first, second):
            assert len(await connection.responses(2)) == 2
        assert app.alone == [True, False, False, False]
        # And alone again once they are answered.
        await _yield_to_the_loop()
        first.send(request(path="/v2/models/a/infer"))
        assert len(await first.responses(3)) == 3
        assert app.alone[-1] is True
        for connection in (first, second):
            await connection.close()

    asyncio.run(main())


def test_the_inline_lane_takes_lone_requests_and_leaves_concurrent_ones_to_the_workers(
    repo: Path, monkeypatch: pytest.MonkeyPatch
):
    ran_inline: list[bool] = []
    run_inline = ServedVersion.run_inline

    def recorded(self: ServedVersion, *args: Any) -> Any:
        results = run_inline(self, *args)
        ran_inline.append(results is not None)
        return results

    monkeypatch.setattr(ServedVersion, "run_inline", recorded)
    (expected,) = reference_run(build_mlp(seed=1), {"X": X})

    async def main(host: Host) -> None:
        app = HttpApp(DataPlane(host))
        connections = [Connection(app)]
        connections += [Connection(app, state=connections[0].state) for _ in range(3)]
        lone = connections[0]
        for count in (1, 2, 3):  # one at a time: each runs on the loop
            lone.send(request())
            assert len(await lone.responses(count)) == count
            await _yield_to_the_loop()
        assert ran_inline == [True, True, True]
        for connection in connections:  # four in one turn: the workers take them all
            connection.send(request())
        answers = [await c.responses(4 if c is lone else 1) for c in connections]
        assert ran_inline == [True, True, True]
        for responses in answers:
            for status, _, body in responses:
                assert status == 200, body
                (output,) = orjson.loads(body)["outputs"]
                np.testing.assert_array_equal(
                    np.array(output["data"], np.float32).reshape(output["shape"]), expected
                )
        for connection in connections:
            await connection.close()

    with Host(repo, inline_run_us=1_000_000) as host:
        host.load("mlp")
        lane_settled(host, "mlp")  # measured on a load worker, after the load
        asyncio.run(main(host))
        assert host.status("mlp").versions[0].inline.startswith("inline:")
        assert host.queue_stats()[("mlp", 1)].accepted == 7


# -- bodies that stop arriving, or break, in process ----------------------------------------

BODY_TIMEOUT_S = 0.2
QUICK = dataclasses.replace(LIMITS, body_timeout_s=BODY_TIMEOUT_S)


async def _until(predicate: Any) -> None:
    async with asyncio.timeout(TIMEOUT_S):
        while not predicate():
            await asyncio.sleep(0.005)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("direct", [True, False], ids=["direct", "asgi"])
def test_a_body_that_stops_arriving_gets_408_and_gives_its_budget_back(host: Host, direct: bool):
    budget = BodyBudget(10**6)
    app = HttpApp(DataPlane(host), body_budget=budget)
    head = request(PLAIN)[: -len(PLAIN)]

    async def main() -> tuple[list[Response], int, bool]:
        connection = Connection(app, direct=direct, limits=QUICK)
        connection.send(head + PLAIN[:10])
        if not direct:  # the app reads the body as it comes: it holds what came, no more
            await _until(lambda: budget.held == 10)
        held = budget.held
        answered = await connection.responses(1)
        await connection.close()
        return answered, held, connection.transport.closed

    [(status, _, body)], held, closed = asyncio.run(main())
    assert status == 408
    assert "body_timeout_s" in orjson.loads(body)["error"]
    assert closed
    assert held == (0 if direct else 10)
    assert budget.held == 0


class SlowReader:
    """An app that reads its body only once ``go`` is set: uvicorn stops reading meanwhile."""

    def __init__(self) -> None:
        self.go = asyncio.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.go.wait()
        while (message := await receive())["type"] == "http.request" and message["more_body"]:
            pass  # a body that stops arriving ends in http.disconnect


@pytest.mark.timeout(30)
def test_a_body_the_server_stopped_reading_is_not_timed_out():
    head = b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 200000\r\n\r\n"

    async def main() -> tuple[bytes, bool, list[Response]]:
        app = SlowReader()
        connection = Connection(app, direct=False, limits=QUICK)
        connection.send(head + b" " * 70_000)  # past uvicorn's 64 KiB: it pauses reading
        await asyncio.sleep(3 * BODY_TIMEOUT_S)  # a span of time, not an order of threads
        paused = bytes(connection.transport.data), connection.protocol.flow.read_paused
        app.go.set()  # the app reads: the body's clock runs again, and it stopped arriving
        answered = await connection.responses(1)
        await connection.close()
        return *paused, answered

    written, was_paused, [(status, _, _)] = asyncio.run(main())
    assert was_paused
    assert written == b""
    assert status == 408


@pytest.mark.timeout(30)
def test_a_body_that_stops_after_its_request_was_answered_closes_the_connection(host: Host):
    app = HttpApp(DataPlane(host))
    # Not found: answered without its body being read; then the body stops.
    raw = request(PLAIN, path="/nothing")[: -len(PLAIN)] + PLAIN[:10]

    async def main() -> tuple[list[Response], bool]:
        connection = Connection(app, direct=False, limits=QUICK)
        connection.send(raw)
        await _until(lambda: connection.transport.closed)
        answered = parse(connection.transport.data)
        await connection.close()
        return answered, connection.transport.closed

    answered, closed = asyncio.run(main())
    assert [status for status, _, _ in answered] == [404]
    assert closed


@pytest.mark.timeout(30)
@pytest.mark.parametrize("direct", [True, False], ids=["direct", "asgi"])
def test_an_h2c_upgrade_with_a_broken_chunked_body_gets_400(host: Host, direct: bool):
    app = HttpApp(DataPlane(host))
    raw = (
        b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n"
        b'Upgrade: h2c\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{"inp\r\nzz\r\n'
    )

    async def main() -> list[Response]:
        connection = Connection(app, direct=direct)
        connection.send(raw)
        answered = await connection.responses(1)
        await connection.close()
        return answered

    [(status, _, body)] = asyncio.run(main())
    assert status == 400
    assert "chunk" in orjson.loads(body)["error"]


@pytest.mark.timeout(30)
def test_an_h2c_upgrade_body_in_pieces_is_answered_and_what_follows_is_not_read(host: Host):
    app = HttpApp(DataPlane(host))
    head = (
        b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n"
        b"Upgrade: h2c\r\nContent-Length: %d\r\n\r\n" % len(PLAIN)
    )

    async def main() -> list[Response]:
        connection = Connection(app)
        connection.send(head)
        connection.send(PLAIN[:10])
        connection.send(PLAIN[10:])
        connection.send(b"GET /v2/health/live HTTP/1.1\r\n\r\n")  # not read: the upgrade ends it
        answered = await connection.responses(2)
        await connection.close()
        return answered

    [(status, headers, body)] = asyncio.run(main())
    assert status == 200
    assert ("connection", "close") in headers
    assert orjson.loads(body)["outputs"][0]["name"] == "Y"
