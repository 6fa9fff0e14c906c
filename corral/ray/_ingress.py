"""V2Ingress: the Open Inference Protocol's HTTP endpoints on Ray Serve, routed by model.

The ingress reads the path, checks the token, reads the body (up to the limit) and hands the
whole request to a model replica, with the path's model as Ray's multiplexed model id so
that Ray routes it to a replica that has the model. It decodes no tensor: the replica runs
corral's own HTTP application, so every endpoint a replica serves answers as ``corral serve``
does.

Served: ``/v2`` and ``/v2/health/*`` (any replica), and everything under
``/v2/models/{name}`` (infer, metadata, ready, config, stats) on the model's replica.
Refused with 404 and a reason: what is one process's view and means nothing for a cluster
(``/v2/repository/*``, ``/v2/models/stats``, ``/metrics``).
"""

from __future__ import annotations

import hmac
import logging

import orjson
from ray.exceptions import RayError
from ray.serve.exceptions import BackPressureError
from ray.serve.handle import DeploymentHandle
from starlette.requests import Request
from starlette.responses import Response

from corral.ray._exchange import HttpAnswer, HttpCall, model_in_path
from corral.ray._replica import ModelReplica

__all__ = ["V2Ingress"]

logger = logging.getLogger(__name__)

_JSON = "application/json"
# Not forwarded to the client as they are: Starlette's response sets its own length.
_DROPPED = frozenset({b"content-length"})


class V2Ingress:
    """The HTTP ingress of :func:`corral.ray.build_app`; Ray constructs it in its replica."""

    def __init__(
        self, models: DeploymentHandle[ModelReplica], auth_token: str | None, max_request_bytes: int
    ) -> None:
        self._models = models
        self._auth = None if auth_token is None else f"Bearer {auth_token}".encode()
        self._max_request_bytes = max_request_bytes

    async def __call__(self, request: Request) -> Response:
        """Answer one HTTP request, forwarding it to a model replica."""
        path: str = request.scope["path"]
        if not path.startswith("/v2/health/"):
            refused = self._refusal(request, path)
            if refused is not None:
                return refused
        limit = self._max_request_bytes
        declared = request.headers.get("content-length", "0")
        if declared.isdigit() and int(declared) > limit:
            return _error(413, f"the request body is larger than {limit} bytes")
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                return _error(413, f"the request body is larger than {limit} bytes")
            chunks.append(chunk)
        call = HttpCall(
            request.method,
            path,
            request.scope["query_string"],
            tuple(request.scope["headers"]),
            b"".join(chunks),
        )
        name = model_in_path(path)
        handle = self._models if name is None else self._models.options(multiplexed_model_id=name)
        try:
            answer: HttpAnswer = await handle.remote(call)
        except BackPressureError as exc:
            return _error(429, f"every model replica is busy: {exc}")
        except RayError as exc:
            logger.exception("corral: forwarding %s %s failed", request.method, path)
            return _error(503, f"no model replica could answer: {exc}")
        headers = {
            key.decode("latin-1"): value.decode("latin-1")
            for key, value in answer.headers
            if key not in _DROPPED
        }
        return Response(answer.body, status_code=answer.status, headers=headers)

    def _refusal(self, request: Request, path: str) -> Response | None:
        if self._auth is not None:
            given = request.headers.get("authorization", "").encode("latin-1")
            if not hmac.compare_digest(given, self._auth):
                response = _error(401, "this server needs the header Authorization: Bearer <token>")
                response.headers["www-authenticate"] = "Bearer"
                return response
        parts = path.strip("/").split("/")
        if parts[:2] == ["v2", "repository"] or parts == ["v2", "models", "stats"]:
            return _error(
                404,
                f"{path} is one process's view and is not served through Ray Serve: "
                "each replica loads the models routed to it",
            )
        if parts == ["metrics"]:
            return _error(404, "on Ray Serve, metrics are Ray's: see its metrics export port")
        return None


def _error(status: int, message: str) -> Response:
    return Response(orjson.dumps({"error": message}), status_code=status, media_type=_JSON)
