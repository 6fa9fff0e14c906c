"""The HTTP routes: every endpoint, its method and its path, parsed in one place.

:class:`Endpoint` is the table: one member per endpoint with its method and path template.
:func:`match` turns a request's method and path into a :class:`Route` (the endpoint and the
names its path carries) or refuses it with :class:`NoRoute` (404 or 405, in the words the
server answers). Everything that routes a request takes it from here: ``corral serve``'s ASGI
app, its direct route for the plainest inference requests (:func:`direct_infer_model`, on
the raw request target), and the Ray ingress (which model's replica gets a request, and which
endpoints are one process's view).

The status page's own files (``/``, ``/dashboard``, ``/static/*``) are not API routes: they
are answered from memory before the table, without the token, when the page is served.

Example::

    route = match("GET", "/v2/models/fraud/versions/2/ready")
    assert route.endpoint is Endpoint.MODEL_READY and route.model == "fraud"
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from corral.server.http.responses import HttpError
from corral.server.tokens import TokenScope

__all__ = [
    "INFER_PREFIX",
    "INFER_SUFFIX",
    "Endpoint",
    "Family",
    "NoRoute",
    "Route",
    "direct_infer_model",
    "infer_model",
    "match",
    "named_route",
]

#: The inference route's path around a model's name: ``/v2/models/{name}/infer``.
INFER_PREFIX = "/v2/models/"
INFER_SUFFIX = "/infer"

_INFER_PREFIX_BYTES = INFER_PREFIX.encode()
_INFER_SUFFIX_BYTES = INFER_SUFFIX.encode()


class Family(enum.Enum):
    """The groups of endpoints, as a path's first segments name them."""

    #: ``/v2``: the server's metadata.
    SERVER = "server"
    #: ``/v2/health/*``: answered without the token.
    HEALTH = "health"
    #: ``/v2/models/...``: a model's metadata, readiness, configuration, statistics, inference.
    MODELS = "models"
    #: ``/v2/repository/...``: Triton's model repository extension (model control).
    REPOSITORY = "repository"
    #: ``/v2/systemsharedmemory/...``, ``/v2/cudasharedmemory/...``: Triton's extensions.
    SHARED_MEMORY = "shared_memory"
    #: ``/v2/corral/status...``: the status page's document.
    STATUS = "status"
    #: ``/metrics``: Prometheus.
    METRICS = "metrics"


class Endpoint(enum.Enum):
    """Every HTTP endpoint: its method and its path's template (``[...]``: optional)."""

    SERVER_METADATA = ("GET", "/v2", Family.SERVER)
    LIVE = ("GET", "/v2/health/live", Family.HEALTH)
    READY = ("GET", "/v2/health/ready", Family.HEALTH)
    MODEL_METADATA = ("GET", "/v2/models/{model}[/versions/{version}]", Family.MODELS)
    MODEL_READY = ("GET", "/v2/models/{model}[/versions/{version}]/ready", Family.MODELS)
    MODEL_CONFIG = ("GET", "/v2/models/{model}[/versions/{version}]/config", Family.MODELS)
    MODEL_STATS = ("GET", "/v2/models/{model}[/versions/{version}]/stats", Family.MODELS)
    INFER = ("POST", "/v2/models/{model}[/versions/{version}]/infer", Family.MODELS)
    ALL_STATS = ("GET", "/v2/models/stats", Family.MODELS)
    REPOSITORY_INDEX = ("POST", "/v2/repository/index", Family.REPOSITORY)
    LOAD = ("POST", "/v2/repository/models/{model}/load", Family.REPOSITORY)
    UNLOAD = ("POST", "/v2/repository/models/{model}/unload", Family.REPOSITORY)
    MEMORY_STATUS = ("GET", "/v2/{memory}[/region/{region}]/status", Family.SHARED_MEMORY)
    MEMORY_REGISTER = ("POST", "/v2/{memory}/region/{region}/register", Family.SHARED_MEMORY)
    MEMORY_UNREGISTER = ("POST", "/v2/{memory}[/region/{region}]/unregister", Family.SHARED_MEMORY)
    STATUS = ("GET", "/v2/corral/status", Family.STATUS)
    MODEL_STATUS = ("GET", "/v2/corral/status/models/{model}", Family.STATUS)
    METRICS = ("GET", "/metrics", Family.METRICS)

    def __init__(self, method: str, template: str, family: Family) -> None:
        self.method = method
        self.template = template
        self.family = family

    @property
    def scope(self) -> TokenScope | None:
        """The scope whose tokens open it (:mod:`corral.server.tokens`); None: no token."""
        return _SCOPES.get(self, _FAMILY_SCOPES.get(self.family))


#: The scope of each family's endpoints, but for the endpoints of :data:`_SCOPES`.
_FAMILY_SCOPES = {
    Family.SERVER: TokenScope.METADATA,
    Family.MODELS: TokenScope.METADATA,
    Family.REPOSITORY: TokenScope.MODEL_CONTROL,
    Family.SHARED_MEMORY: TokenScope.SHARED_MEMORY,
    Family.STATUS: TokenScope.STATISTICS,
    Family.METRICS: TokenScope.STATISTICS,
}
#: The endpoints whose scope is not their family's.
_SCOPES = {
    Endpoint.INFER: TokenScope.INFERENCE,
    Endpoint.MODEL_STATS: TokenScope.STATISTICS,
    Endpoint.ALL_STATS: TokenScope.STATISTICS,
}


#: The shared memory kinds a path may name: Triton's system and CUDA shared memory.
MEMORY_KINDS = ("systemsharedmemory", "cudasharedmemory")


@dataclass(frozen=True, slots=True)
class Route:
    """A request's endpoint and the names its path carries (None where it carries none)."""

    endpoint: Endpoint
    #: The model a ``/v2/models/{model}``, load, unload or model status path names.
    model: str | None = None
    #: The version a ``/versions/{version}`` segment names.
    version: str | None = None
    #: ``systemsharedmemory`` or ``cudasharedmemory``, for the shared memory endpoints.
    memory: str | None = None
    #: The region a shared memory path names.
    region: str | None = None


class NoRoute(HttpError):
    """No endpoint answers this method and path: 404, or 405 naming the method to use."""

    def __init__(
        self, status: int, message: str, family: Family | None, route: Route | None = None
    ) -> None:
        super().__init__(status, message)
        #: The family the path's first segments name, if any: the health checks' refusals
        #: are answered without the token, as the health checks are.
        self.family = family
        #: The route the path names when only the method is wrong (405), else None.
        self.route = route


def infer_model(method: str, path: str) -> str | None:
    """The model of ``POST /v2/models/{name}/infer`` in its plainest spelling, else None.

    The busiest route, taken before :func:`match`: a name without ``/`` and no version.
    Any other spelling of it (a version, a trailing slash, an empty name) goes through
    :func:`match`, which answers it the same way.
    """
    if method != "POST" or not path.startswith(INFER_PREFIX) or not path.endswith(INFER_SUFFIX):
        return None
    name = path[len(INFER_PREFIX) : -len(INFER_SUFFIX)]
    return name if name and "/" not in name else None


def direct_infer_model(target: bytes) -> str | None:
    """The model a raw request target names as :func:`infer_model` takes it, else None.

    For a server reading the request line itself: the target must be the inference path
    with no escape, query or fragment, so that its model is the name the ASGI path would
    decode from it.
    """
    if not (target.startswith(_INFER_PREFIX_BYTES) and target.endswith(_INFER_SUFFIX_BYTES)):
        return None
    raw_name = target[len(_INFER_PREFIX_BYTES) : -len(_INFER_SUFFIX_BYTES)]
    if not raw_name or not raw_name.isascii():
        return None
    # Looked for in a str: CPython's `bytes in bytes` first tries the operand as an int,
    # raising and clearing a TypeError each time (measured: 2 k instructions a look).
    name = raw_name.decode("ascii")
    if "/" in name or "%" in name or "?" in name or "#" in name:
        return None
    return name


def match(method: str, path: str, *, status_page: bool = True) -> Route:
    """The route of ``method`` and ``path`` (decoded, as ASGI gives it); :class:`NoRoute` if none.

    ``status_page``: whether ``/v2/corral/status`` is served (else its paths are unknown).
    """
    parts = path.strip("/").split("/")
    if parts == ["metrics"]:
        return _checked(method, Route(Endpoint.METRICS))
    if parts[0] == "v1":
        raise NoRoute(
            404,
            f"no such endpoint: {path}: corral serves the KServe v2 protocol (the Open "
            "Inference Protocol), not v1: send inference to POST /v2/models/{model}/infer "
            "(docs/server.md, Endpoints)",
            None,
        )
    if parts[0] != "v2":
        raise _unknown(path)
    rest = parts[1:]
    if not rest:
        return _checked(method, Route(Endpoint.SERVER_METADATA))
    family = rest[0]
    if family == "health" and len(rest) == 2:
        return _health(method, rest[1])
    if family == "models":
        return _models(method, path, rest[1:])
    if family == "repository":
        return _repository(method, rest[1:])
    if family in MEMORY_KINDS:
        return _shared_memory(method, path, family, rest[1:])
    if rest[:2] == ["corral", "status"] and status_page:
        return _status(method, path, rest[2:])
    raise _unknown(path)


def named_route(method: str, path: str) -> tuple[Route | None, Family | None]:
    """The route a path names even when the method is wrong, and the family of its path.

    For routing a request on without answering it (the Ray ingress picks a replica by it):
    ``(None, family)`` when no endpoint has the path, the family None when not even that.
    """
    try:
        route = match(method, path)
    except NoRoute as missing:
        return missing.route, missing.family
    return route, route.endpoint.family


def _health(method: str, which: str) -> Route:
    if which == "live":
        return _checked(method, Route(Endpoint.LIVE))
    if which == "ready":
        return _checked(method, Route(Endpoint.READY))
    if method != "GET":
        raise _not_allowed(method, "GET", Family.HEALTH)
    raise NoRoute(404, f"no such health endpoint: {which!r}", Family.HEALTH)


def _models(method: str, path: str, rest: list[str]) -> Route:
    # /v2/models/stats, or /v2/models/{m}[/versions/{v}][/ready|/infer|/config|/stats]
    if rest == ["stats"]:
        return _checked(method, Route(Endpoint.ALL_STATS))
    if not rest or not rest[0]:
        raise NoRoute(404, "no model named in the path", Family.MODELS)
    name, tail = rest[0], rest[1:]
    version: str | None = None
    if tail[:1] == ["versions"]:
        if len(tail) < 2 or not tail[1]:
            raise NoRoute(404, "no version named in the path", Family.MODELS)
        version, tail = tail[1], tail[2:]
    if len(tail) > 1:
        raise _unknown(path, Family.MODELS)
    endpoint = _MODEL_ACTIONS.get(tail[0]) if tail else Endpoint.MODEL_METADATA
    if endpoint is None:
        raise _unknown(path, Family.MODELS)
    return _checked(method, Route(endpoint, model=name, version=version))


_MODEL_ACTIONS = {
    "ready": Endpoint.MODEL_READY,
    "config": Endpoint.MODEL_CONFIG,
    "stats": Endpoint.MODEL_STATS,
    "infer": Endpoint.INFER,
}


def _repository(method: str, rest: list[str]) -> Route:
    # Every repository endpoint is a POST: the method is checked before the path.
    if method != "POST":
        raise _not_allowed(method, "POST", Family.REPOSITORY)
    if rest == ["index"]:
        return Route(Endpoint.REPOSITORY_INDEX)
    if len(rest) == 3 and rest[0] == "models" and rest[2] in ("load", "unload"):
        endpoint = Endpoint.LOAD if rest[2] == "load" else Endpoint.UNLOAD
        return Route(endpoint, model=rest[1])
    raise NoRoute(404, "no such repository endpoint", Family.REPOSITORY)


def _shared_memory(method: str, path: str, memory: str, rest: list[str]) -> Route:
    # /v2/{memory}[/region/{name}]/status|unregister, /v2/{memory}/region/{name}/register
    region: str | None = None
    if len(rest) == 3 and rest[0] == "region" and rest[1]:
        region, action = rest[1], rest[2]
    elif len(rest) == 1 and rest[0] in ("status", "unregister"):
        action = rest[0]
    else:
        action = ""
    if action == "register" and region is None:
        action = ""
    endpoint = _MEMORY_ACTIONS.get(action)
    if endpoint is None:
        raise NoRoute(404, f"no such shared memory endpoint: {path}", Family.SHARED_MEMORY)
    return _checked(method, Route(endpoint, memory=memory, region=region))


_MEMORY_ACTIONS = {
    "status": Endpoint.MEMORY_STATUS,
    "register": Endpoint.MEMORY_REGISTER,
    "unregister": Endpoint.MEMORY_UNREGISTER,
}


def _status(method: str, path: str, rest: list[str]) -> Route:
    # /v2/corral/status[?page=...], /v2/corral/status/models/{name}
    if method != "GET":
        raise _not_allowed(method, "GET", Family.STATUS)
    if not rest:
        return Route(Endpoint.STATUS)
    if len(rest) == 2 and rest[0] == "models" and rest[1]:
        return Route(Endpoint.MODEL_STATUS, model=rest[1])
    raise _unknown(path, Family.STATUS)


def _checked(method: str, route: Route) -> Route:
    allowed = route.endpoint.method
    if method != allowed:
        raise _not_allowed(method, allowed, route.endpoint.family, route)
    return route


def _not_allowed(method: str, allowed: str, family: Family, route: Route | None = None) -> NoRoute:
    return NoRoute(405, f"method {method} not allowed here; use {allowed}", family, route)


def _unknown(path: str, family: Family | None = None) -> NoRoute:
    return NoRoute(404, f"no such endpoint: {path}", family)
