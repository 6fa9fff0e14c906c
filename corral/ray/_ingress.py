"""V2Ingress: the Open Inference Protocol's HTTP endpoints on Ray Serve, routed by model.

The ingress reads the path, checks the token, reads the body (up to the limit) and hands the
whole request to a model replica, with the path's model as Ray's multiplexed model id so
that Ray routes it to a replica that has the model. It decodes no tensor: the replica runs
corral's own HTTP application, so every endpoint a replica serves answers as ``corral serve``
does.

Served: ``/v2`` and ``/v2/health/*`` (any replica), and everything under
``/v2/models/{name}`` (infer, metadata, ready, config) on the model's replica. What is one
process's view in ``corral serve`` (the repository's index, loads and unloads, statistics,
``/metrics``, the status page) is asked of every replica at once (Ray's ``broadcast``) and
their answers made one (:mod:`corral.ray._fanout`): a load reaches every replica running.

Hot models. A model with ``hot_model_in_flight`` requests or more in flight at this ingress
is hot: its further inference requests go without a model id, so Ray's own routing (the
shorter queue of two replicas) spreads them over every replica, and a replica that does not
hold the model loads it on its first such request, under its own budget (issue 50, part 2).
A spread request answered 503 (the replica could not fit the model, or was overloaded) is
sent once more to the model's own replicas, by its id. The copies cool down as the model
does, and each replica's budget evicts them, least recently used first; Ray's routes stay
with the model's replicas.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import orjson
from ray.exceptions import RayError
from ray.serve.exceptions import BackPressureError
from ray.serve.handle import DeploymentHandle
from starlette.requests import Request
from starlette.responses import Response

from corral.ray._exchange import HttpAnswer, HttpCall
from corral.ray._fanout import (
    FANOUT_TIMEOUT_S,
    FanoutError,
    Reply,
    all_succeeded,
    every_status,
    labelled_metrics,
    merged_index,
    passed_answer,
    summed_statistics,
)
from corral.ray._grpc_ingress import GrpcIngress, GrpcListener
from corral.ray._replica import ModelReplica
from corral.ray._spreading import HotModels
from corral.server.http.requests import check_token, read_body
from corral.server.http.responses import HttpError
from corral.server.http.routes import Endpoint, Family, named_route
from corral.server.tokens import TokenPolicy

__all__ = ["V2Ingress"]

logger = logging.getLogger(__name__)

_JSON = "application/json"
# Not forwarded to the client as they are: Starlette's response sets its own length.
_DROPPED = frozenset({b"content-length"})
# The endpoints every replica is asked, and how their answers are made one.
_FANNED_OUT: dict[Endpoint, Callable[[Sequence[Reply]], HttpAnswer]] = {
    Endpoint.REPOSITORY_INDEX: merged_index,
    Endpoint.LOAD: all_succeeded,
    Endpoint.UNLOAD: all_succeeded,
    Endpoint.ALL_STATS: summed_statistics,
    Endpoint.MODEL_STATS: summed_statistics,
    Endpoint.METRICS: labelled_metrics,
    Endpoint.STATUS: every_status,
    Endpoint.MODEL_STATUS: every_status,
}


class V2Ingress:
    """The HTTP ingress of :func:`corral.ray.build_app`; Ray constructs it in its replica."""

    def __init__(
        self,
        models: DeploymentHandle[ModelReplica],
        auth_token: str | None,
        max_request_bytes: int,
        hot_model_in_flight: int = 0,
        grpc: GrpcListener | None = None,
    ) -> None:
        self._models = models
        # One token for every scope: the ingress has no scoped tokens (corral.server.tokens).
        self._tokens = TokenPolicy.build(auth_token, {})
        self._max_request_bytes = max_request_bytes
        # Each model's requests in flight here, both protocols together, and when they spread.
        self._hot = HotModels(hot_model_in_flight)
        # Its gRPC server, with ``grpc`` (corral.ray._grpc_ingress), made on Ray's running loop.
        self._grpc = None
        if grpc is not None:
            self._grpc = GrpcIngress(models, grpc, auth_token, max_request_bytes, self._hot)
            # Ray awaits an instance's __del__ when it stops the replica; the collector never
            # calls one that is not the class's.
            self.__del__ = self._grpc.stop

    async def grpc_address(self) -> str | None:
        """Where this ingress replica serves gRPC (``host:port``), once it does; None: not."""
        return None if self._grpc is None else await self._grpc.address()

    def check_health(self) -> None:
        """Ray's health check of the replica: raises if its gRPC server failed to start."""
        if self._grpc is not None:
            self._grpc.check()

    async def __call__(self, request: Request) -> Response:
        """Answer one HTTP request, forwarding it to a model replica."""
        path: str = request.scope["path"]
        endpoint, family, name = _routed(request.method, path)
        try:
            if family is not Family.HEALTH and self._tokens.any_closed:
                scope = None if endpoint is None else endpoint.scope
                check_token(request.scope["headers"], self._tokens, scope)
            body = await read_body(request.scope, request.receive, self._max_request_bytes)
        except HttpError as exc:
            return _error(exc.status, str(exc), exc.headers)
        call = HttpCall(
            request.method,
            path,
            request.scope["query_string"],
            tuple(request.scope["headers"]),
            body,
        )
        try:
            merge = None if endpoint is None else _FANNED_OUT.get(endpoint)
            if merge is not None:
                answer = await self._ask_every_replica(call, merge)
            else:
                answer = await self._forward(call, name, spread=endpoint is Endpoint.INFER)
        except HttpError as exc:
            return _error(exc.status, str(exc), exc.headers)
        except TimeoutError:
            return _error(503, f"the model replicas did not all answer in {FANOUT_TIMEOUT_S:.0f} s")
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

    async def _ask_every_replica(
        self, call: HttpCall, merge: Callable[[Sequence[Reply]], HttpAnswer]
    ) -> HttpAnswer:
        """``call`` asked of every model replica running now; their answers made one.

        A replica that could not answer fails the request (503, naming it): the answer is
        never a part of the deployment's silently.
        """
        answers = await self._models.broadcast("__call__", call).results_async(
            timeout_s=FANOUT_TIMEOUT_S
        )
        try:
            return merge([Reply.of(answer) for answer in answers])
        except FanoutError as exc:
            passed = passed_answer(exc)
            if passed is not None:
                return passed
            raise HttpError(
                503, f"the model replicas' answers could not be made one: {exc}"
            ) from None

    async def _forward(self, call: HttpCall, name: str | None, *, spread: bool) -> HttpAnswer:
        """Hand ``call`` to a replica: the model's own, or any while the model is hot.

        Only inference requests (``spread``) go to any replica: metadata, readiness and
        statistics are the model's own replicas'.
        """
        if name is None:
            answer: HttpAnswer = await self._models.remote(call)
            return answer
        routed = self._models.options(multiplexed_model_id=name)
        return await self._hot.send(
            name,
            spread=spread,
            to_its_own=lambda: routed.remote(call),
            to_any=lambda: self._models.remote(call),
            refused=lambda answer: answer.status == 503,
        )


def _routed(method: str, path: str) -> tuple[Endpoint | None, Family | None, str | None]:
    """The endpoint, family and model a request names, as far as the route table knows them.

    A request no endpoint answers is forwarded all the same: a replica refuses it in the
    words ``corral serve`` uses.
    """
    route, family = named_route(method, path)
    if route is None:
        return None, family, None
    return route.endpoint, family, route.model if family is Family.MODELS else None


def _error(status: int, message: str, headers: tuple[tuple[bytes, bytes], ...] = ()) -> Response:
    response = Response(orjson.dumps({"error": message}), status_code=status, media_type=_JSON)
    for key, value in headers:
        response.headers[key.decode("latin-1")] = value.decode("latin-1")
    return response
