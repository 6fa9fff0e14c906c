"""The server's logs: request ids, access lines, and the text and JSON formats.

corral's library modules only log; :func:`configure_logging` is called once, by ``corral
serve`` at its edge. An access line is a record on the logger :data:`ACCESS_LOGGER` whose
``access`` attribute holds its fields (:data:`ACCESS_FIELDS`); the text format writes them as
``key=value`` pairs, the JSON format as keys of the line's object.

A request id is a client's ``X-Request-ID`` header (gRPC: the metadata ``x-request-id``), or,
with the access log on, an inference request's own ``id`` or one made here. One that is too
long or holds other characters than :data:`REQUEST_ID_CHARACTERS` is refused, so that no id
can break a log line or a header.

Example::

    configure_logging(level="info", log_format="json", grpc_level="warning", access_log=True)
"""

from __future__ import annotations

import logging
import os
import string
import time
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson

__all__ = [
    "ACCESS_FIELDS",
    "ACCESS_LOGGER",
    "MAX_REQUEST_ID_CHARS",
    "REQUEST_ID_CHARACTERS",
    "REQUEST_ID_HEADER",
    "TEXT_FORMAT",
    "AccessLine",
    "HttpExchange",
    "JsonFormatter",
    "configure_logging",
    "log_access",
    "new_request_id",
    "request_id_problem",
]

#: The logger access lines are written on, at INFO.
ACCESS_LOGGER = "corral.access"
#: The header (HTTP) and metadata key (gRPC) that carry a request id, both ways.
REQUEST_ID_HEADER = "x-request-id"
#: The longest request id taken.
MAX_REQUEST_ID_CHARS = 128
#: The characters a request id may hold: those of UUIDs, W3C trace ids, base64 and URLs' paths.
REQUEST_ID_CHARACTERS = frozenset(string.ascii_letters + string.digits + "-_.:/+=@~")
#: The fields of an access line, in the order the text format writes them.
ACCESS_FIELDS = (
    "protocol",
    "method",
    "path",
    "model",
    "version",
    "status",
    "bytes",
    "duration_ms",
    "request_id",
    "client",
)
#: The text format's lines: the time, the level, the logger, then the message.
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_access_logger = logging.getLogger(ACCESS_LOGGER)
# What the text format writes as is; any other value is quoted, as a JSON string.
_PLAIN = frozenset(string.ascii_letters + string.digits + "-_.:/+=@~,[]()")


def request_id_problem(value: str) -> str | None:
    """Why ``value`` cannot be a request id, or None when it can."""
    if not value:
        return "is empty"
    if len(value) > MAX_REQUEST_ID_CHARS:
        return f"is {len(value)} characters long; at most {MAX_REQUEST_ID_CHARS} are taken"
    if not REQUEST_ID_CHARACTERS.issuperset(value):
        return (
            "holds characters other than letters, digits and -_.:/+=@~ "
            f"(got {value[:MAX_REQUEST_ID_CHARS]!r})"
        )
    return None


def new_request_id() -> str:
    """A request id for a request that came without one: 32 hex digits, random."""
    return uuid.uuid4().hex


class AccessLine:
    """An access line's message: its fields, written as ``key=value`` when formatted as text.

    Built only when the access log is on; the text is made only if a handler writes it.
    """

    __slots__ = ("fields",)

    def __init__(self, fields: dict[str, Any]) -> None:
        self.fields = fields

    def __str__(self) -> str:
        return " ".join(f"{key}={_plain(self.fields[key])}" for key in ACCESS_FIELDS)

    def summary(self) -> str:
        """A short message for the JSON format, whose fields are keys of their own."""
        fields = self.fields
        return f"{fields['method']} {fields['path']} {fields['status']}"


def _plain(value: object) -> str:
    if value is None:
        return "-"
    text = str(value)
    if text and _PLAIN.issuperset(text):
        return text
    # A path may hold anything a client put in it, percent-decoded: a newline, a quote.
    return orjson.dumps(text).decode()


def log_access(fields: dict[str, Any]) -> None:
    """Write one access line with these fields (:data:`ACCESS_FIELDS`)."""
    line = AccessLine(fields)
    _access_logger.info(line, extra={"access": fields})


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time``, ``level``, ``logger``, ``message``, and more.

    An access line adds its fields as keys (:data:`ACCESS_FIELDS`); a record with an exception
    adds ``exception``, its traceback as text. ``time`` is UTC, ISO 8601, to the millisecond.
    ``process``: the server process's number under ``--processes``, written as ``process``.
    """

    def __init__(self, process: int | None = None) -> None:
        super().__init__()
        self._process = process

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON."""
        document: dict[str, Any] = {
            "time": _utc(record.created),
            "level": record.levelname,
            "logger": record.name,
        }
        if self._process is not None:
            document["process"] = self._process
        if isinstance(record.msg, AccessLine):
            document["message"] = record.msg.summary()
            document.update(record.msg.fields)
        else:
            document["message"] = record.getMessage()
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            document["exception"] = record.exc_text
        if record.stack_info:
            document["stack"] = self.formatStack(record.stack_info)
        return orjson.dumps(document, default=str).decode()


def _utc(created: float) -> str:
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
    return f"{seconds}.{int(created % 1 * 1000):03d}Z"


def configure_logging(
    *,
    level: str,
    log_format: str,
    grpc_level: str,
    access_log: bool,
    process: int | None = None,
    file: str | None = None,
) -> None:
    """Set up the process's logging: for ``corral serve`` only, at its edge.

    ``level`` is the root's (corral's own); grpc's loggers get ``grpc_level``, so that
    ``--log-level debug`` is corral's lines, not grpc's internals; the access logger is at
    INFO when ``access_log`` is on, whatever ``level`` is. Lines go to standard error.
    ``file``: the process's standard error is that file from here on, appended to (opened
    here: an ``OSError`` names it if it cannot be), so that what writes there without
    Python's logging (grpc's core, a Python model's worker process, a fatal error's
    traceback) lands beside the log lines, as Triton's ``--log-file`` takes its whole log.
    ``process``: this server process's number under ``--processes``, on every line.
    """
    # As logging.basicConfig: logging configured before (by an embedding program, a test
    # runner) is kept, and its standard error left as it is.
    if not logging.getLogger().handlers:
        if file is not None:
            _append_stderr_to(file)
        logging.basicConfig(level=level.upper(), handlers=[_handler(log_format, process)])
    logging.getLogger("grpc").setLevel(grpc_level.upper())
    if access_log:
        _access_logger.setLevel(logging.INFO)


def _append_stderr_to(file: str) -> None:
    # O_APPEND: every process of a group appends to the one file, and a line is one write
    # (standard error is line-buffered, and a handler flushes each record), never split.
    fd = os.open(file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.dup2(fd, 2)
    finally:
        os.close(fd)


def _handler(log_format: str, process: int | None) -> logging.Handler:
    handler = logging.StreamHandler()
    formatter: logging.Formatter
    if log_format == "json":
        formatter = JsonFormatter(process)
    elif process is None:
        formatter = logging.Formatter(TEXT_FORMAT)
    else:
        formatter = logging.Formatter(
            TEXT_FORMAT.replace("%(name)s", f"[process {process}] %(name)s")
        )
    handler.setFormatter(formatter)
    return handler


class HttpExchange:
    """One HTTP request's id, and with the access log on, what its line needs.

    Made only for a request that carries ``X-Request-ID`` or when the access log is on; its
    :meth:`send` wraps the ASGI ``send`` to echo the id and count the answer's status and
    bytes. ``refused`` says why the header's id cannot be taken (the app answers 400).
    """

    __slots__ = (
        "_generate",
        "_send",
        "body_id",
        "bytes",
        "refused",
        "request_id",
        "scope",
        "started_ns",
        "status",
    )

    def __init__(
        self,
        scope: MutableMapping[str, Any],
        send: Callable[[MutableMapping[str, Any]], Awaitable[None]],
        *,
        access_log: bool,
    ) -> None:
        self.scope = scope
        self._send = send
        self._generate = access_log
        self.started_ns = time.perf_counter_ns() if access_log else 0
        self.request_id: str | None = None
        self.body_id: str | None = None
        self.refused: str | None = None
        self.status = 0
        self.bytes = 0
        for key, value in scope["headers"]:
            if key == b"x-request-id":
                given = value.decode("latin-1")
                problem = request_id_problem(given)
                if problem is not None:
                    self.refused = f"the header X-Request-ID {problem}"
                else:
                    self.request_id = given

    async def send(self, message: MutableMapping[str, Any]) -> None:
        """Pass ``message`` on, with the request id added to the answer's headers."""
        if message["type"] == "http.response.start":
            self.status = message["status"]
            if self.request_id is None and self._generate:
                body_id = self.body_id
                usable = body_id is not None and request_id_problem(body_id) is None
                self.request_id = body_id if usable else new_request_id()
            if self.request_id is not None:
                header = (REQUEST_ID_HEADER.encode(), self.request_id.encode())
                message["headers"] = [*message["headers"], header]
        elif message["type"] == "http.response.body":
            self.bytes += len(message.get("body", b""))
        await self._send(message)

    def log(self) -> None:
        """Write the request's access line."""
        scope = self.scope
        path: str = scope["path"]
        model, version = _model_in(path)
        client = scope.get("client")
        log_access(
            {
                "protocol": "http",
                "method": scope["method"],
                "path": path,
                "model": model,
                "version": version,
                "status": self.status,
                "bytes": self.bytes,
                "duration_ms": round((time.perf_counter_ns() - self.started_ns) / 1e6, 3),
                "request_id": self.request_id,
                "client": None if client is None else f"{client[0]}:{client[1]}",
            }
        )


def _model_in(path: str) -> tuple[str | None, str | None]:
    # /v2/models/{m}[/versions/{v}]/..., /v2/repository/models/{m}/load|unload
    parts = path.strip("/").split("/")
    if parts[:3] == ["v2", "repository", "models"] and len(parts) > 3:
        return parts[3] or None, None
    if parts[:2] != ["v2", "models"] or len(parts) < 3 or parts[2] in ("", "stats"):
        return None, None
    version = parts[4] if len(parts) > 4 and parts[3] == "versions" else None
    return parts[2], version or None
