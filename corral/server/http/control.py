"""The control endpoints over HTTP: Triton's repository and shared memory extensions.

``POST /v2/repository/index``, ``.../models/{name}/load`` (with Triton's ``config`` and
``file:<path>`` parameters) and ``.../unload``; ``/v2/systemsharedmemory/...`` and
``/v2/cudasharedmemory/...`` (status, register, unregister). Each reads its body within the
server's body budget, checks every field it is given (an unknown one is refused by name), and
hands the operation to the data plane, which runs it off the event loop.

Example::

    control = HttpControl(plane, bodies, max_request_bytes=64 * 1024 * 1024)
    await control.answer(match("POST", "/v2/repository/index"), scope, receive, send)
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import orjson

from corral.protocol.dataplane import DataPlane, run_blocking
from corral.protocol.json.documents import index_doc, region_doc
from corral.protocol.shm import cuda_shared_memory_refused, cuda_status
from corral.server.bodies import BodyBudget, BodyReservation
from corral.server.http.compression import inflate, request_encoding
from corral.server.http.requests import DECODE_INLINE_BYTES, read_body
from corral.server.http.responses import (
    JSON,
    HttpError,
    Receive,
    Scope,
    Send,
    respond,
    respond_json,
)
from corral.server.http.routes import Endpoint, Route

__all__ = ["CONTROL_ENDPOINTS", "HttpControl"]

#: The endpoints :meth:`HttpControl.answer` answers.
CONTROL_ENDPOINTS = frozenset(
    {
        Endpoint.REPOSITORY_INDEX,
        Endpoint.LOAD,
        Endpoint.UNLOAD,
        Endpoint.MEMORY_STATUS,
        Endpoint.MEMORY_REGISTER,
        Endpoint.MEMORY_UNREGISTER,
    }
)


class HttpControl:
    """Answers the repository and shared memory endpoints of one HTTP app."""

    def __init__(self, plane: DataPlane, bodies: BodyBudget, max_request_bytes: int) -> None:
        self._plane = plane
        self._bodies = bodies
        self._max_request_bytes = max_request_bytes

    async def answer(self, route: Route, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer a request whose route is one of :data:`CONTROL_ENDPOINTS`."""
        endpoint = route.endpoint
        if endpoint is Endpoint.REPOSITORY_INDEX:
            await self._index(scope, receive, send)
        elif endpoint in (Endpoint.LOAD, Endpoint.UNLOAD):
            assert route.model is not None  # the route names it
            await self._load_or_unload(endpoint, route.model, scope, receive, send)
        elif endpoint is Endpoint.MEMORY_STATUS:
            if route.memory == "cudasharedmemory":
                rows = cuda_status(route.region)
            else:
                rows = self._plane.shared_memory_status(route.region)
            await respond_json(send, 200, [region_doc(row) for row in rows])
        else:
            await self._register_or_unregister(route, scope, receive, send)

    async def _index(self, scope: Scope, receive: Receive, send: Send) -> None:
        with self._bodies.reserve(0) as held:
            body = await self._read_inflated(scope, receive, held)
        ready_only = False
        if body.strip():
            try:
                options = orjson.loads(body)
            except orjson.JSONDecodeError as exc:
                raise HttpError(400, f"the index request is not JSON: {exc}") from None
            if not isinstance(options, dict) or not isinstance(options.get("ready", False), bool):
                raise HttpError(400, 'the index request must be {"ready": true|false}')
            ready_only = options.get("ready", False)
        rows = await self._plane.control.repository_index(ready_only=ready_only)
        await respond_json(send, 200, [index_doc(row) for row in rows])

    async def _load_or_unload(
        self, endpoint: Endpoint, name: str, scope: Scope, receive: Receive, send: Send
    ) -> None:
        with self._bodies.reserve(0) as held:
            body = await self._read_inflated(scope, receive, held)
            if endpoint is Endpoint.LOAD:
                if len(body) > DECODE_INLINE_BYTES:
                    config, files = await run_blocking(load_parameters, name, body)
                else:
                    config, files = load_parameters(name, body)
                # Held until the load ends: the uploaded bytes are in memory until then.
                await self._plane.control.load(name, config=config, files=files)
            else:
                drop_upload = unload_parameters(name, body)
                await self._plane.control.unload(name, drop_upload=drop_upload)
        await respond(send, 200, b"", JSON)

    async def _register_or_unregister(
        self, route: Route, scope: Scope, receive: Receive, send: Send
    ) -> None:
        with self._bodies.reserve(0) as held:
            body = await read_body(scope, receive, self._max_request_bytes, held)
        if route.endpoint is Endpoint.MEMORY_UNREGISTER:
            if body.strip():
                raise HttpError(400, "an unregister request takes no body")
            # No CUDA region can be registered here, so there is none to unregister.
            if route.memory == "systemsharedmemory":
                self._plane.unregister_shared_memory(route.region)
            await respond(send, 200, b"", JSON)
            return
        assert route.region is not None  # register needs a region: the route has one
        if route.memory == "cudasharedmemory":
            raise cuda_shared_memory_refused()
        key, offset, byte_size = register_parameters(body)
        await self._plane.register_shared_memory(route.region, key, offset, byte_size)
        await respond(send, 200, b"", JSON)

    async def _read_inflated(self, scope: Scope, receive: Receive, held: BodyReservation) -> bytes:
        # A control request's body, inflated (on a worker thread) when it is compressed.
        encoding = request_encoding(scope["headers"])
        body = await read_body(scope, receive, self._max_request_bytes, held)
        if encoding is None:
            return body
        return await run_blocking(inflate, body, encoding, self._max_request_bytes, held)


def load_parameters(name: str, body: bytes) -> tuple[str | None, dict[str, bytes] | None]:
    """A load's ``config`` and its ``file:<path>`` files, base64-decoded; others refused."""
    what = f"failed to load {name!r}"
    parameters = _control_parameters(what, body)
    config = parameters.get("config")
    if config is not None and not isinstance(config, str):
        raise HttpError(400, f"{what}: the 'config' parameter must be a string of JSON")
    files: dict[str, bytes] = {}
    unknown = []
    for key, value in parameters.items():
        if key == "config":
            continue
        if not key.startswith("file:"):
            unknown.append(key)
            continue
        if not isinstance(value, str):
            raise HttpError(400, f"{what}: the parameter {key!r} must be a base64 string")
        try:
            files[key.removeprefix("file:")] = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise HttpError(400, f"{what}: the parameter {key!r} is not base64: {exc}") from None
    if unknown:
        raise HttpError(
            400,
            f"{what}: load parameters {sorted(unknown)} are not supported: a load takes "
            "'config' and 'file:<version>/<name>'",
        )
    return config, files or None


def unload_parameters(name: str, body: bytes) -> bool:
    """An unload's ``drop_upload``: Triton's ``unload_dependents`` (no model has any) and it.

    ``drop_upload`` true also drops the config and files a load gave the model (see
    ``Host.unload``).
    """
    what = f"failed to unload {name!r}"
    parameters = _control_parameters(what, body)
    unknown = sorted(set(parameters) - {"unload_dependents", "drop_upload"})
    if unknown:
        raise HttpError(400, f"{what}: unload parameters {unknown} are not supported")
    for flag in ("unload_dependents", "drop_upload"):
        if not isinstance(parameters.get(flag, False), bool):
            raise HttpError(400, f"{what}: {flag!r} must be true or false")
    return bool(parameters.get("drop_upload", False))


def register_parameters(body: bytes) -> tuple[str, int, int]:
    """The key, offset and byte size of a system shared memory register request's body."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise HttpError(400, f"the register request is not JSON: {exc}") from None
    if type(document) is not dict:
        raise HttpError(400, 'the register request must be {"key": ..., "byte_size": ...}')
    unknown = sorted(set(document) - {"key", "offset", "byte_size"})
    if unknown:
        raise HttpError(
            400,
            f"the register request has fields {unknown} that it does not take; it takes "
            "key, offset and byte_size",
        )
    key = document.get("key")
    if type(key) is not str:
        raise HttpError(400, "Shared memory register request has no 'key' field (a string)")
    if "byte_size" not in document:
        raise HttpError(400, "Shared memory register request has no 'byte_size' field")
    offset, byte_size = document.get("offset", 0), document["byte_size"]
    for label, value in (("offset", offset), ("byte_size", byte_size)):
        if type(value) is not int or value < 0:
            raise HttpError(
                400,
                f"the register request's {label!r} must be a non-negative integer; got {value!r}",
            )
    return key, offset, byte_size


def _control_parameters(what: str, body: bytes) -> dict[str, Any]:
    """The ``parameters`` of a load or unload body (``{}`` for an empty body)."""
    if not body.strip():
        return {}
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise HttpError(400, f"{what}: the request is not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise HttpError(400, f'{what}: the request must be a JSON object {{"parameters": {{...}}}}')
    unknown = sorted(set(document) - {"parameters"})
    if unknown:
        raise HttpError(400, f"{what}: unknown request fields {unknown}: only 'parameters'")
    parameters = document.get("parameters", {})
    if not isinstance(parameters, dict):
        raise HttpError(400, f"{what}: 'parameters' must be a JSON object")
    return parameters
