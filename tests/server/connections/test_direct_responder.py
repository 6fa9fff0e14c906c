"""DirectResponder alone: which requests take the direct route, and how their bodies are held.

The requests and their answers over real sockets, on both routes: test_direct_infer.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from corral.server.bodies import BodyBudget, BodyReservation
from corral.server.connections.direct import DirectResponder


class Parser:
    def __init__(self, method: bytes = b"POST", version: str = "1.1") -> None:
        self.method, self.version = method, version

    def get_method(self) -> bytes:
        return self.method

    def get_http_version(self) -> str:
        return self.version


@dataclass
class Connection:
    url: bytes = b"/v2/models/m/infer"
    parser: Parser = field(default_factory=Parser)
    cycle: Any = None
    pipeline: list[Any] = field(default_factory=list)
    headers: list[tuple[bytes, bytes]] = field(default_factory=lambda: [(b"content-length", b"9")])


class App:
    """hold_body as HttpApp's: a reservation of nothing yet, or None when it cannot fit."""

    def __init__(self, budget: BodyBudget) -> None:
        self.budget = budget

    def hold_body(self, declared: int) -> BodyReservation | None:
        return self.budget.reserve(0) if self.budget.fits(declared) else None


@pytest.mark.parametrize(
    ("change", "taken"),
    [
        ({}, True),
        ({"url": b"/v2/models/m/infer?x=1"}, False),
        ({"url": b"/v2/models/m/versions/1/infer"}, False),
        ({"parser": Parser(b"GET")}, False),
        ({"parser": Parser(version="1.0")}, False),
        ({"pipeline": ["a request before"]}, False),
        ({"headers": [(b"content-length", b"9"), (b"x-request-id", b"r")]}, False),
        ({"headers": [(b"transfer-encoding", b"chunked")]}, False),
    ],
)
def test_only_the_plainest_request_takes_the_route(change: dict[str, Any], taken: bool):
    responder = DirectResponder(App(BodyBudget(1 << 20)))
    connection = Connection(**change)
    assert responder.take(connection) is taken
    assert responder.name == ("m" if taken else None)


def test_a_large_body_is_held_in_the_budget_as_it_arrives_and_given_back_when_dropped():
    budget = BodyBudget(300_000)
    responder = DirectResponder(App(budget))
    size = 200_000  # past the small-body bound: held as it arrives
    connection = Connection(
        headers=[
            (b"content-length", str(size).encode()),
            (b"inference-header-content-length", b"2"),
        ]
    )
    assert responder.take(connection)
    responder.keep(b"x" * 150_000)
    assert budget.held == 150_000
    responder.drop()
    assert budget.held == 0
    assert responder.name is None


def test_a_large_body_that_cannot_fit_now_takes_the_asgi_route():
    budget = BodyBudget(300_000)
    kept = budget.reserve(250_000)
    responder = DirectResponder(App(budget))
    connection = Connection(headers=[(b"content-length", b"200000")])
    assert not responder.take(connection)
    kept.release()


def test_a_body_past_the_budgets_room_is_dropped_as_it_arrives():
    budget = BodyBudget(300_000)
    responder = DirectResponder(App(budget))
    connection = Connection(headers=[(b"content-length", b"200000")])
    assert responder.take(connection)
    other = budget.reserve(250_000)  # another request took the room meanwhile
    responder.keep(b"x" * 100_000)
    assert budget.held == 250_000  # nothing of this body is held: it will be answered 503
    responder.keep(b"x" * 100_000)  # the rest is read and dropped
    assert budget.held == 250_000
    other.release()
    responder.drop()
