"""What corral's HTTP edge is given: the bounds on its connections, and the app of the direct route.

Plain types, apart from :mod:`corral.server.connections.edge` (which re-exports them), so that what
the edge is held to reads without the adapter's uvicorn internals.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol

from corral.server.bodies import BodyReservation

__all__ = ["ConnectionLimits", "DirectApp"]


@dataclass(frozen=True)
class ConnectionLimits:
    """The bounds every HTTP connection is held to (``ServerSettings`` fields of these names)."""

    #: Longest request target (path and query), in bytes: 414 past it.
    max_url_bytes: int
    #: Longest request head (request line and headers), in bytes: 431 past it.
    max_header_bytes: int
    #: Seconds from a request's first byte to the end of its headers: 408 past them.
    header_timeout_s: float
    #: Seconds a connection with no request in progress stays open.
    idle_timeout_s: float
    #: Connections open at once.
    max_connections: int
    #: Seconds a request's body may go without a byte arriving: 408 and close past them.
    body_timeout_s: float
    #: Bytes per second a body must bring over each ``body_timeout_s`` window: 408 and close
    #: under it (0: only silence is cut).
    body_min_rate_bytes_s: int = 1024


class DirectApp(Protocol):
    """An app that answers an inference request whose body is read (``HttpApp``)."""

    async def answer_infer(
        self,
        name: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        loop: asyncio.AbstractEventLoop,
        alone: bool = False,
        *,
        held: BodyReservation | None = None,
        refused: Exception | None = None,
    ) -> tuple[int, bytes, bytes]:
        """The status, header lines and body answering ``POST /v2/models/{name}/infer``.

        ``alone``: no other request of the server's is in flight (see
        :data:`corral.server.http.app.ALONE_SCOPE_KEY`). ``held``: the body's bytes, reserved as
        they arrived (:meth:`hold_body`); ``refused``: why its bytes stopped being kept.
        """
        ...

    def hold_body(self, declared: int) -> BodyReservation | None:
        """A reservation (of nothing yet) for a body of ``declared`` bytes, held as it arrives.

        None when the body would be refused (too large, or it does not fit the budget now):
        the request then takes the ASGI route, which answers that before reading it.
        """
        ...
