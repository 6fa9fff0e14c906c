"""What the HTTP server reads from a request before any route runs: its body, token, codings.

Used by ``corral serve``'s app and by the Ray ingress alike, so that both refuse the same
requests with the same words.

Example::

    check_token(scope["headers"], TokenPolicy.build("s3cret", {}), TokenScope.INFERENCE)
    body = await read_body(scope, receive, limit=64 * 1024 * 1024)
"""

from __future__ import annotations

import re

from corral.protocol.json.codec import HEADER_LENGTH
from corral.server.bodies import BodyReservation
from corral.server.http.compression import request_encoding, response_encoding
from corral.server.http.responses import HttpError, Receive, Scope
from corral.server.tokens import TokenPolicy, TokenScope

__all__ = [
    "DECODE_INLINE_BINARY_BYTES",
    "DECODE_INLINE_BYTES",
    "Coding",
    "check_token",
    "int_header",
    "read_body",
    "request_coding",
    "too_large",
]

#: Bodies up to this size are decoded on the event loop; larger ones on a worker thread (but
#: see DECODE_INLINE_BINARY_BYTES). Measured: a hand-off costs about 85 us; decoding 64 KiB
#: of JSON numbers 1.6 ms, 1 MiB 21 ms, for which every other client's request would wait.
DECODE_INLINE_BYTES = 64 * 1024
#: A binary body (the binary tensor extension) up to this size is decoded on the event loop
#: too when its JSON part is at most DECODE_INLINE_BYTES and names no BYTES tensor: its other
#: tensors are views of the body, copied at most once (when misaligned) or checked by numpy
#: (BOOL), so 1 MiB of them costs 4-101 us to decode, against the hand-off's 85. BYTES
#: elements are made one by one: 20 ms for 256 KiB of empty strings.
DECODE_INLINE_BINARY_BYTES = 1024 * 1024

#: An inference request's codings, from its headers: the JSON part's length (binary tensor
#: extension), the body's Content-Encoding and the answer's, each None when not asked for.
Coding = tuple[int | None, str | None, str | None]

_ASKS_FOR_TOKEN = ((b"www-authenticate", b"Bearer"),)
# A header's whole number: ASCII digits only, few enough for int() to read. int() alone also
# takes a sign, spaces, underscores and other scripts' digits, and refuses 4,300+ digits.
_WHOLE_NUMBER = re.compile(rb"[0-9]{1,18}")


async def read_body(
    scope: Scope, receive: Receive, limit: int, held: BodyReservation | None = None
) -> bytes:
    """A request's whole body, refused with 413 past ``limit`` bytes.

    A declared Content-Length over the limit is refused before a byte of the body is read.
    With ``held``, the body's bytes are reserved in its budget as they arrive, chunk by
    chunk: a declared length that does not fit what is free now is refused before a byte
    is read, but is never reserved ahead of its bytes (a client announcing 64 MiB and
    sending nothing holds nothing); :class:`~corral.server.bodies.BodyBudgetExceeded` if
    they do not fit. Raises :class:`HttpError`: 413, or 400 for a malformed Content-Length
    or a client that went away before sending the whole body (or whose body stopped
    arriving: the connection answers that 408 itself, ``corral.server.connections.edge``).
    """
    declared = 0
    for key, value in scope["headers"]:
        if key == b"content-length":
            declared = int_header("content-length", value)
            if declared > limit:
                raise too_large(limit)
    if held is not None:
        held.check_room(declared - held.size)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise HttpError(400, "the client went away before sending the whole body")
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        if held is not None and size > held.size:
            held.grow(size - held.size)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def check_token(
    headers: list[tuple[bytes, bytes]], policy: TokenPolicy, scope: TokenScope | None
) -> None:
    """Raise :class:`HttpError` 401 unless the request's Authorization header opens ``scope``.

    ``headers`` are the request's, names lowercase; ``policy`` says which ``Bearer <token>``
    values open which scope (:mod:`corral.server.tokens`; compared in constant time).
    ``scope`` None: a path no endpoint answers, told apart from a refusal only to a caller
    some scope is open to. The refusal names the scope, never a token.
    """
    values = [value for key, value in headers if key == b"authorization"]
    if scope is None:
        if policy.allows_some(values):
            return
        needed = "a token of this server"
    else:
        if policy.allows(scope, values):
            return
        needed = f"a token of its {scope.value} scope"
    raise HttpError(
        401,
        f"this server needs the header Authorization: Bearer <token> with {needed}",
        _ASKS_FOR_TOKEN,
    )


def request_coding(headers: list[tuple[bytes, bytes]]) -> Coding:
    """An inference request's codings; :class:`EncodingRefused` (415) for one not served."""
    header_length: int | None = None
    coded = accepts = False  # the codings are read only from requests that name them
    for key, value in headers:
        if key == b"inference-header-content-length":
            # The JSON part's length in the inflated body, as tritonclient counts it.
            header_length = int_header(HEADER_LENGTH, value)
        elif key == b"content-encoding":
            coded = True
        elif key == b"accept-encoding":
            accepts = True
    encoding = request_encoding(headers) if coded else None
    answer_encoding = response_encoding(headers) if accepts else None
    return header_length, encoding, answer_encoding


def too_large(limit: int) -> HttpError:
    """The 413 refusing a body over ``limit`` bytes."""
    return HttpError(413, f"the request body is larger than {limit} bytes")


def int_header(name: str, value: bytes) -> int:
    """A header's value as a non-negative integer; :class:`HttpError` 400 if it is not one.

    ASCII digits only, at most 18 of them.
    """
    if not _WHOLE_NUMBER.fullmatch(value):
        shown = value if len(value) <= 40 else value[:40] + b"..."
        raise HttpError(
            400, f"header {name} must be a non-negative integer in ASCII digits, got {shown!r}"
        )
    return int(value)
