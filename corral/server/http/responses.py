"""How the HTTP server answers: the one table of error statuses, and the answer's bytes.

Every error is a JSON ``{"error": "..."}`` body. Its status comes from :func:`error_status`,
the one mapping of errors to HTTP statuses: a corral error's class through :data:`STATUS`
(domain errors carry no HTTP codes), an :class:`HttpError`'s own status for what the HTTP
edge refuses before the data plane sees a request (a path, a method, a header, a body).

Example::

    status, body, headers = error_answer(exc, "POST", "/v2/models/fraud/infer")
    await respond(send, status, body, JSON, headers)
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson

from corral._base import (
    CorralError,
    DeadlineExceeded,
    DrainTimeout,
    HostClosed,
    InferenceError,
    InvalidInput,
    InvalidModelName,
    LoadRequestInvalid,
    ModelInvalid,
    ModelLoadError,
    ModelNotFound,
    ModelTooLarge,
    Overloaded,
    ProviderUnavailable,
    RepositoryError,
    RuntimeClosed,
    SessionClosed,
    StoreUnavailable,
    UploadRefused,
    UploadTooLarge,
)
from corral.protocol.costs import RequestTooLarge
from corral.protocol.dataplane import status_for
from corral.protocol.json.codec import encode_error
from corral.protocol.model_control import ModelControlUnsupported
from corral.protocol.shm import (
    SharedMemoryExists,
    SharedMemoryNotFound,
    SharedMemoryUnsupported,
    TooManyRegions,
)
from corral.server.bodies import BodyBudgetExceeded
from corral.server.http.compression import EncodingRefused

__all__ = [
    "BINARY",
    "JSON",
    "RETRY_AFTER_S",
    "STATUS",
    "Headers",
    "HttpError",
    "Receive",
    "Scope",
    "Send",
    "error_answer",
    "error_status",
    "expect_method",
    "head",
    "respond",
    "respond_json",
]

logger = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Headers = tuple[tuple[bytes, bytes], ...]

#: The content type of every JSON answer, errors included.
JSON = (b"content-type", b"application/json")
#: The content type of an answer in the binary tensor extension.
BINARY = (b"content-type", b"application/octet-stream")

#: HTTP status per corral error class; the most specific class listed wins.
STATUS: dict[type[CorralError], int] = {
    InvalidInput: 400,
    InvalidModelName: 400,
    ModelNotFound: 404,
    Overloaded: 429,
    InferenceError: 500,
    # A load that failed for what may pass (a storage error, no room for now, its timeout):
    # 503, with Retry-After.
    ModelLoadError: 503,
    # What is on disk cannot be served as it is (not ONNX, a refused model.toml or
    # config.pbtxt), or the model alone is larger than the whole budget, or its model.toml
    # names a provider this build lacks: every retry fails alike until its files (or the
    # server's options) change, so not 503. Triton answers a load that fails so 400 too.
    ModelInvalid: 400,
    ModelTooLarge: 400,
    ProviderUnavailable: 400,
    # The client's mistake, as Triton's HTTP endpoint answers it.
    LoadRequestInvalid: 400,
    UploadRefused: 400,
    UploadTooLarge: 413,
    # A repository folder gone: the server cannot serve it here and now.
    RepositoryError: 503,
    HostClosed: 503,
    RuntimeClosed: 503,
    SessionClosed: 503,
    DeadlineExceeded: 504,
    # An object store that did not answer a model's fetch in time: retryable (Retry-After).
    StoreUnavailable: 503,
    # An unload that waited its whole timeout for a hung load or for leases.
    DrainTimeout: 503,
    # Triton's codes for its shared memory extension.
    SharedMemoryNotFound: 404,
    SharedMemoryExists: 400,
    TooManyRegions: 400,
    SharedMemoryUnsupported: 501,
    ModelControlUnsupported: 501,
    # A request whose decoded form passes max_request_bytes, as a body over it.
    RequestTooLarge: 413,
}

#: How long a client answered 503 is told to wait before retrying, in seconds (Retry-After):
#: refused by the body budget, or a failure that may pass.
RETRY_AFTER_S = 1

_RETRY_AFTER = ((b"retry-after", str(RETRY_AFTER_S).encode()),)
#: How long a client whose model could not be fetched from the object store is told to wait.
STORE_RETRY_AFTER_S = 5
_STORE_RETRY_AFTER = ((b"retry-after", str(STORE_RETRY_AFTER_S).encode()),)


class HttpError(Exception):
    """A request the app refuses before the data plane sees it (bad path, method, body)."""

    def __init__(self, status: int, message: str, headers: Headers = ()) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers


def error_status(error: BaseException) -> int | None:
    """The HTTP status that answers ``error``; None: no answer (a cancellation)."""
    if isinstance(error, (HttpError, EncodingRefused)):
        return error.status
    if isinstance(error, BodyBudgetExceeded):
        return 503
    if isinstance(error, CorralError):
        return status_for(STATUS, error) or 500
    return 500 if isinstance(error, Exception) else None


def error_answer(
    error: Exception, method: object, path: object, public: Callable[[str], str] | None = None
) -> tuple[int, bytes, Headers]:
    """The status, JSON body and extra headers that answer ``error``; unexpected ones logged.

    ``public`` turns the error's text into what a client may read (the data plane's
    :meth:`~corral.protocol.DataPlane.public_text`: no server folders); the log keeps it whole.
    """
    if not isinstance(error, (HttpError, EncodingRefused, BodyBudgetExceeded, CorralError)):
        logger.error("corral: %s %s failed", method, path, exc_info=error)
        text = f"internal error: {error!r}"
        return 500, encode_error(text if public is None else public(text)), ()
    extra: Headers = ()
    status = error_status(error) or 500
    if isinstance(error, HttpError):
        extra = error.headers
    elif isinstance(error, StoreUnavailable):
        extra = _STORE_RETRY_AFTER
    elif status == 503:
        # What may pass (the body budget, a load's storage or timeout, a closing server):
        # when to try again. Every permanent failure has another status.
        extra = _RETRY_AFTER
    text = str(error)
    if isinstance(error, CorralError) and public is not None:
        text = public(text)
    return status, encode_error(text), extra


def expect_method(method: str, allowed: str) -> None:
    """Raise :class:`HttpError` 405 unless ``method`` is ``allowed``."""
    if method != allowed:
        raise HttpError(405, f"method {method} not allowed here; use {allowed}")


def head(content_type: tuple[bytes, bytes], length: int, extra: Headers) -> bytes:
    """A response's header lines, ``name: value`` and CRLF each: its type, length and ``extra``.

    What a server writing the response itself (the direct route) puts after the status line.
    """
    lines = [content_type[0], b": ", content_type[1], b"\r\ncontent-length: %d\r\n" % length]
    for key, value in extra:
        lines += (key, b": ", value, b"\r\n")
    return b"".join(lines)


async def respond(
    send: Send, status: int, body: bytes, content_type: tuple[bytes, bytes], extra: Headers = ()
) -> None:
    """Send a whole response, with its Content-Length, as two ASGI messages."""
    headers = [content_type, (b"content-length", str(len(body)).encode()), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def respond_json(send: Send, status: int, document: object) -> None:
    """Send ``document`` as a JSON response."""
    await respond(send, status, orjson.dumps(document), JSON)
