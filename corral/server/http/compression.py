"""HTTP body compression: ``Content-Encoding`` requests inflated, ``Accept-Encoding`` answers.

tritonclient's ``request_compression_algorithm`` sends a body compressed with ``gzip`` or
``deflate`` (zlib's format, as HTTP means it) and its ``response_compression_algorithm`` asks
for the answer the same way. A compressed body is inflated a piece at a time and refused with
413 as soon as its inflated size passes the request limit: a small body that would inflate to
gigabytes (a compression bomb) costs at most the limit, never its whole size. Its inflated
bytes are also held in the body budget as they come, so that many such bodies at once are
refused (503) like large plain ones. Any other ``Content-Encoding`` is refused with 415.

Example::

    encoding = request_encoding(scope["headers"])        # None, "gzip" or "deflate"
    body = inflate(body, encoding, limit, held)           # on a worker thread
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

from corral.server.bodies import BodyReservation

__all__ = [
    "ENCODINGS",
    "INFLATE_PIECE_BYTES",
    "RESPONSE_COMPRESSION_LEVEL",
    "EncodingRefused",
    "compress",
    "inflate",
    "request_encoding",
    "response_encoding",
]

#: The content codings understood, each with zlib's window bits for its format.
ENCODINGS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
#: The most bytes inflated at once: the limit is checked after each piece.
INFLATE_PIECE_BYTES = 1024 * 1024
# The two bytes that open a gzip member (RFC 1952, ID1 and ID2).
_GZIP_MAGIC = b"\x1f\x8b"
#: zlib's level for compressed answers: the fastest, since answers are mostly numbers.
RESPONSE_COMPRESSION_LEVEL = 1


class EncodingRefused(Exception):
    """A body's coding cannot be honoured; ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def request_encoding(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The request body's coding, ``"gzip"`` or ``"deflate"``; None when it has none.

    Raises :class:`EncodingRefused` (415) for any other coding, or for codings applied one over
    another, naming it.
    """
    encoding: str | None = None
    for key, value in headers:
        if key != b"content-encoding":
            continue
        text = value.decode("latin-1").strip().lower()
        if text in ("", "identity"):
            continue
        if text not in ENCODINGS or encoding is not None:
            raise EncodingRefused(
                415,
                f"Content-Encoding {value.decode('latin-1')!r} is not supported: "
                "send gzip, deflate or an uncompressed body",
            )
        encoding = text
    return encoding


def inflate(body: bytes, encoding: str, limit: int, held: BodyReservation | None) -> bytes:
    """``body`` inflated from ``encoding``, refused past ``limit`` inflated bytes.

    A gzip body may be several members one after another (RFC 1952), inflated in turn as one
    body. Inflates at most :data:`INFLATE_PIECE_BYTES` at a time; with ``held``, the inflated bytes
    past those it already holds are reserved as they come
    (:class:`~corral.server.bodies.BodyBudgetExceeded` if they do not fit). Raises
    :class:`EncodingRefused`: 413 past ``limit``, 400 for a body that is not valid
    ``encoding`` data or ends before its stream does.
    """
    pieces: list[bytes] = []
    size = 0
    pending = body
    try:
        while True:
            inflater = zlib.decompressobj(ENCODINGS[encoding])
            while not inflater.eof:
                piece = inflater.decompress(pending, INFLATE_PIECE_BYTES)
                pending = inflater.unconsumed_tail
                if not piece and not pending:
                    break  # every byte read and nothing more comes out: cut short (below)
                size += len(piece)
                if size > limit:
                    raise EncodingRefused(
                        413,
                        f"the request body inflates from {encoding} to more than {limit} bytes "
                        "(max_request_bytes counts the inflated size)",
                    )
                if held is not None and size > held.size:
                    held.grow(size - held.size)
                pieces.append(piece)
            if not inflater.eof:
                raise EncodingRefused(400, f"the request body's {encoding} stream is cut short")
            pending = inflater.unused_data
            # RFC 1952: a gzip body may hold several members, one after another (pigz
            # writes them); each is inflated in turn, the limit counting them all.
            if not (encoding == "gzip" and pending.startswith(_GZIP_MAGIC)):
                break
    except zlib.error as exc:
        raise EncodingRefused(
            400, f"the request body is not valid {encoding} data: {exc}"
        ) from None
    if pending:
        raise EncodingRefused(
            400, f"the request body has {len(pending)} bytes after its {encoding} data"
        )
    return b"".join(pieces)


def response_encoding(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The coding to answer with: the first of gzip or deflate ``Accept-Encoding`` allows."""
    for key, value in headers:
        if key != b"accept-encoding":
            continue
        for item in value.decode("latin-1").split(","):
            coding, _, parameters = item.strip().lower().partition(";")
            if coding.strip() in ENCODINGS and not _refused(parameters):
                return coding.strip()
    return None


def compress(payload: bytes, encoding: str) -> bytes:
    """``payload`` compressed with ``encoding`` (``gzip`` or ``deflate``)."""
    compressor = zlib.compressobj(RESPONSE_COMPRESSION_LEVEL, zlib.DEFLATED, ENCODINGS[encoding])
    return compressor.compress(payload) + compressor.flush()


def _refused(parameters: str) -> bool:
    # "gzip;q=0" refuses gzip; a malformed weight is read as no weight.
    for parameter in parameters.split(";"):
        name, _, weight = parameter.strip().partition("=")
        if name.strip() == "q":
            try:
                return float(weight) <= 0
            except ValueError:
                return False
    return False
