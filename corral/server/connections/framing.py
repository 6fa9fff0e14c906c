"""A request body's framing at the HTTP/1.1 edge, where llhttp alone would get it wrong.

Two cases, both used by :mod:`corral.server.connections.edge`'s connections:

- a ``Transfer-Encoding`` other than ``chunked`` is refused with 400 naming it
  (:func:`transfer_coding_refusal`): llhttp would hand on a ``gzip, chunked`` body still
  gzipped, as if it were not, and fail on a ``gzip`` one only once the app reads its body;
- an upgrade request served as HTTP/1.1 (h2c, as ``curl --http2`` asks on plain http) has
  its body read by a parser of its own (:class:`BodyAfterUpgrade`): llhttp stops at an
  upgrade request's head, so the app would get an empty body.

Example::

    framing = body_framing(headers)          # its Content-Length line, say; None: no body
    body = BodyAfterUpgrade(connection, framing)
    body.feed(bytes_after_the_head)          # connection.on_body(...), on_message_complete()
"""

from __future__ import annotations

from typing import Protocol

import httptools

__all__ = ["BodyAfterUpgrade", "BodySink", "body_framing", "transfer_coding_refusal"]


class BodySink(Protocol):
    """What a request's body is handed to: the connection reading it."""

    def on_body(self, body: bytes) -> None:
        """A piece of the body."""
        ...

    def on_message_complete(self) -> None:
        """The body is whole."""
        ...


class BodyAfterUpgrade:
    """The body of an upgrade request served as HTTP/1.1, read by a parser of its own.

    llhttp reads nothing past an upgrade request's head; this parser is given a head of the
    same framing (``framing``: its Content-Length or Transfer-Encoding line), then the bytes
    that follow the real one, and hands the body to the connection.
    """

    def __init__(self, connection: BodySink, framing: bytes) -> None:
        self._connection = connection
        self.complete = False  # the whole body was read
        self._parser = httptools.HttpRequestParser(self)
        self._parser.feed_data(b"POST / HTTP/1.1\r\n" + framing + b"\r\n")

    def feed(self, data: bytes) -> None:
        """Parse ``data``; :class:`httptools.HttpParserError` if the body's framing breaks."""
        self._parser.feed_data(data)

    def on_body(self, body: bytes) -> None:
        """A piece of the body, for the request's app."""
        self._connection.on_body(body)

    def on_message_complete(self) -> None:
        """The body is whole: the request's app has it all."""
        self.complete = True
        self._connection.on_message_complete()


def transfer_coding_refusal(headers: list[tuple[bytes, bytes]]) -> tuple[int, str] | None:
    """The status and message refusing a head's ``Transfer-Encoding``; None if it is chunked.

    A coding other than chunked would be ignored by llhttp (``gzip, chunked``: the body
    handed on still gzipped) or break the parser after the head (``gzip``): refused by
    name before the request begins. ``headers``: the head's, names lowercase.
    """
    for key, value in headers:
        if key != b"transfer-encoding":
            continue
        codings = [coding.strip().lower() for coding in value.split(b",")]
        if any(coding != b"chunked" for coding in codings):
            text = value.decode("latin-1")
            return (
                400,
                f"Transfer-Encoding {text!r} is not supported: send the body chunked, or with "
                "a Content-Length (compress it with Content-Encoding: gzip or deflate)",
            )
    return None


def body_framing(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    """The header lines of a head that frame its body, or None when it has none."""
    lines = [
        key + b": " + value + b"\r\n"
        for key, value in headers
        if key == b"transfer-encoding" or (key == b"content-length" and value.strip() != b"0")
    ]
    return b"".join(lines) or None
