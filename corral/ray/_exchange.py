"""One HTTP exchange as plain data, and running it through an ASGI application in process.

On Ray Serve the ingress receives the HTTP request and a model replica answers it: what
travels between them is an :class:`HttpCall` and an :class:`HttpAnswer`, small frozen
records Ray serializes like any other argument. The replica runs the call through the same
:class:`corral.server.http.app.HttpApp` that ``corral serve`` runs, so both give the same
answers, errors and statuses. Nothing here imports Ray.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from corral.server.http.routes import Family, named_route

__all__ = ["REPLICA_HEADER", "HttpAnswer", "HttpCall", "call_asgi", "model_in_path"]

Headers = tuple[tuple[bytes, bytes], ...]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Asgi = Callable[[MutableMapping[str, Any], Receive, Send], Awaitable[None]]

#: Response header naming the replica that answered (Ray's replica id).
REPLICA_HEADER = b"corral-replica"


@dataclass(frozen=True, slots=True)
class HttpCall:
    """An HTTP request, whole: what the ingress hands a model replica."""

    method: str
    #: The decoded path, as ASGI gives it (``/v2/models/fraud/infer``).
    path: str
    query_string: bytes
    #: Lower-cased names, as ASGI gives them.
    headers: Headers
    body: bytes


@dataclass(frozen=True, slots=True)
class HttpAnswer:
    """An HTTP response, whole: what a model replica hands back."""

    status: int
    headers: Headers
    body: bytes


def model_in_path(path: str) -> str | None:
    """The model a ``/v2/models/{name}...`` endpoint's path names, or None for any other path.

    ``/v2/models/stats`` (every model's statistics) names none. Taken from the route table
    (:mod:`corral.server.http.routes`), whatever the method.
    """
    route, family = named_route("GET", path)
    return route.model if route is not None and family is Family.MODELS else None


async def call_asgi(app: Asgi, call: HttpCall) -> HttpAnswer:
    """Run ``call`` through the ASGI application ``app`` in this process; its whole answer.

    Raises :class:`RuntimeError` if ``app`` returns without starting a response, which an
    HTTP application must do.
    """
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": call.method,
        "scheme": "http",
        "path": call.path,
        "raw_path": call.path.encode(),
        "query_string": call.query_string,
        "root_path": "",
        "headers": list(call.headers),
        "client": None,
        "server": None,
    }
    body_sent = False

    async def receive() -> Message:
        nonlocal body_sent
        if body_sent:
            # The body went in one message: anything asked for after it is the end.
            return {"type": "http.disconnect"}
        body_sent = True
        return {"type": "http.request", "body": call.body, "more_body": False}

    status: int | None = None
    headers: Headers = ()
    chunks: list[bytes] = []

    async def send(message: Message) -> None:
        nonlocal status, headers
        if message["type"] == "http.response.start":
            status = message["status"]
            headers = tuple((bytes(k), bytes(v)) for k, v in message.get("headers", ()))
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    if status is None:
        raise RuntimeError(f"the application sent no response to {call.method} {call.path}")
    return HttpAnswer(status, headers, b"".join(chunks))
