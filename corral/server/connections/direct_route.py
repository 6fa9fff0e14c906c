"""Which inference requests corral serve's connections may answer directly, by their heads.

The direct route (:mod:`corral.server.connections.edge`) answers the plainest ``POST
/v2/models/{name}/infer`` from the parser's callbacks, without the ASGI path. Here is what
its head must say for that, apart from what the connection itself knows (the method, the
HTTP version, the URL, a request pipelined before it): no ``Expect``, ``Transfer-Encoding``
or ``X-Request-ID`` header, which need what only the ASGI path does (100-continue, a chunked
body, the id's echo), and a ``Content-Length`` within these bounds:

- at most :data:`DIRECT_BODY_BYTES`: the whole body is kept as it arrives, then reserved in
  the app's body budget at once (a connection holds at most this much outside the budget);
- at most :data:`DIRECT_HELD_BODY_BYTES` for a body not compressed (no
  ``Content-Encoding``, ``Inference-Header-Content-Length`` given at most once): an image's
  tensor as tritonclient sends it, binary or JSON. Its bytes are reserved in the budget as
  they arrive, as the ASGI path reserves them.
"""

from __future__ import annotations

from corral.server.http.requests import DECODE_INLINE_BINARY_BYTES, DECODE_INLINE_BYTES

__all__ = ["DIRECT_BODY_BYTES", "DIRECT_HELD_BODY_BYTES", "direct_body"]

#: The largest body of any inference request answered directly and kept whole before it is
#: reserved; the app decodes bodies up to this size on the event loop.
DIRECT_BODY_BYTES = DECODE_INLINE_BYTES
#: The largest body answered directly with its bytes held in the body budget as they
#: arrive. The app decodes a binary one on the event loop unless its JSON part names BYTES
#: tensors, a JSON one on a worker thread in its turn (corral.server.http.decode_turns); either
#: way the ASGI path's receive, send and scope are saved.
DIRECT_HELD_BODY_BYTES = DECODE_INLINE_BINARY_BYTES

# Headers whose requests take the ASGI path: they need what only it does.
_NOT_DIRECT = frozenset((b"expect", b"transfer-encoding", b"x-request-id"))


def direct_body(headers: list[tuple[bytes, bytes]]) -> tuple[int, bool] | None:
    """The body's length and whether it is held as it arrives, if it may go directly.

    ``headers`` are the request's, names lowercase. None: the request takes the ASGI path
    (a header that needs it, no Content-Length or a malformed one, a body too large).
    """
    length = None
    header_lengths = 0
    encoded = False
    for key, value in headers:
        if key == b"content-length":
            length = value
        elif key == b"inference-header-content-length":
            header_lengths += 1
        elif key == b"content-encoding":
            encoded = True
        elif key in _NOT_DIRECT:
            return None
    # bytes.isdigit() is ASCII digits only; int() refuses 4,300+ of them.
    if length is None or not length.isdigit() or len(length) > 18:
        return None
    size = int(length)
    if size <= DIRECT_BODY_BYTES:
        return size, False
    if size <= DIRECT_HELD_BODY_BYTES and header_lengths <= 1 and not encoded:
        return size, True
    return None
