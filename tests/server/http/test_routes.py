"""The route table: every endpoint parsed in one place, the same way for every way in.

``corral.server.http.routes`` is what the ASGI app, the direct route on the raw request target and
the Ray ingress all ask. These tests hold the table against example requests, its refusals
(the words and statuses the server answers), the two shortcuts for the busiest route against
the general parse, and that ``HttpApp`` answers every endpoint the table has.
"""

from __future__ import annotations

import asyncio
import re
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral import Host
from corral.protocol import DataPlane
from corral.server.http.app import HttpApp
from corral.server.http.routes import (
    Endpoint,
    Family,
    NoRoute,
    Route,
    direct_infer_model,
    infer_model,
    match,
)
from corral.server.observe.metrics import Metrics
from corral.server.observe.status import StatusBoard

# One request per endpoint, and the route it must give.
EXAMPLES: list[tuple[str, str, Route]] = [
    ("GET", "/v2", Route(Endpoint.SERVER_METADATA)),
    ("GET", "/v2/", Route(Endpoint.SERVER_METADATA)),
    ("GET", "/v2/health/live", Route(Endpoint.LIVE)),
    ("GET", "/v2/health/ready", Route(Endpoint.READY)),
    ("GET", "/v2/models/m", Route(Endpoint.MODEL_METADATA, model="m")),
    ("GET", "/v2/models/m/versions/3", Route(Endpoint.MODEL_METADATA, model="m", version="3")),
    ("GET", "/v2/models/m/ready", Route(Endpoint.MODEL_READY, model="m")),
    ("GET", "/v2/models/m/versions/2/ready", Route(Endpoint.MODEL_READY, model="m", version="2")),
    ("GET", "/v2/models/m/config", Route(Endpoint.MODEL_CONFIG, model="m")),
    ("GET", "/v2/models/m/stats", Route(Endpoint.MODEL_STATS, model="m")),
    ("GET", "/v2/models/stats", Route(Endpoint.ALL_STATS)),
    ("POST", "/v2/models/m/infer", Route(Endpoint.INFER, model="m")),
    ("POST", "/v2/models/m/versions/1/infer", Route(Endpoint.INFER, model="m", version="1")),
    ("POST", "/v2/models/m/infer/", Route(Endpoint.INFER, model="m")),
    ("POST", "/v2/repository/index", Route(Endpoint.REPOSITORY_INDEX)),
    ("POST", "/v2/repository/models/m/load", Route(Endpoint.LOAD, model="m")),
    ("POST", "/v2/repository/models/m/unload", Route(Endpoint.UNLOAD, model="m")),
    (
        "GET",
        "/v2/systemsharedmemory/status",
        Route(Endpoint.MEMORY_STATUS, memory="systemsharedmemory"),
    ),
    (
        "GET",
        "/v2/cudasharedmemory/region/r/status",
        Route(Endpoint.MEMORY_STATUS, memory="cudasharedmemory", region="r"),
    ),
    (
        "POST",
        "/v2/systemsharedmemory/region/r/register",
        Route(Endpoint.MEMORY_REGISTER, memory="systemsharedmemory", region="r"),
    ),
    (
        "POST",
        "/v2/systemsharedmemory/unregister",
        Route(Endpoint.MEMORY_UNREGISTER, memory="systemsharedmemory"),
    ),
    ("GET", "/v2/corral/status", Route(Endpoint.STATUS)),
    ("GET", "/v2/corral/status/models/m", Route(Endpoint.MODEL_STATUS, model="m")),
    ("GET", "/metrics", Route(Endpoint.METRICS)),
]


@pytest.mark.parametrize(("method", "path", "route"), EXAMPLES)
def test_each_endpoint_is_matched_with_the_names_its_path_carries(
    method: str, path: str, route: Route
):
    assert match(method, path) == route
    assert route.endpoint.method == method


def test_every_endpoint_has_an_example():
    assert {route.endpoint for _, _, route in EXAMPLES} == set(Endpoint)


@pytest.mark.parametrize(("method", "path", "route"), EXAMPLES)
def test_the_wrong_method_is_405_naming_the_right_one(method: str, path: str, route: Route):
    wrong = "GET" if method == "POST" else "POST"
    with pytest.raises(NoRoute) as refused:
        match(wrong, path)
    assert refused.value.status == 405
    assert str(refused.value) == f"method {wrong} not allowed here; use {method}"
    assert refused.value.family is route.endpoint.family
    # The repository's and the status page's endpoints check the method before the path:
    # no route is named then.
    if route.endpoint.family not in (Family.REPOSITORY, Family.STATUS):
        assert refused.value.route == route


@pytest.mark.parametrize(
    ("method", "path", "message", "family"),
    [
        ("GET", "/", "no such endpoint: /", None),
        (  # KServe's v1 protocol: named, with the v2 path to use instead (issue 48)
            "POST",
            "/v1/models/m:predict",
            "no such endpoint: /v1/models/m:predict: corral serves the KServe v2 protocol (the "
            "Open Inference Protocol), not v1: send inference to POST /v2/models/{model}/infer "
            "(docs/server.md, Endpoints)",
            None,
        ),
        ("GET", "/v2/nope", "no such endpoint: /v2/nope", None),
        ("GET", "/v2/health", "no such endpoint: /v2/health", None),
        ("GET", "/v2/health/sick", "no such health endpoint: 'sick'", Family.HEALTH),
        ("GET", "/v2/models/", "no model named in the path", Family.MODELS),
        ("GET", "/v2/models//ready", "no model named in the path", Family.MODELS),
        ("GET", "/v2/models/m/versions", "no version named in the path", Family.MODELS),
        ("GET", "/v2/models/m/versions//ready", "no version named in the path", Family.MODELS),
        ("GET", "/v2/models/m/nope", "no such endpoint: /v2/models/m/nope", Family.MODELS),
        ("GET", "/v2/models/m/ready/x", "no such endpoint: /v2/models/m/ready/x", Family.MODELS),
        ("POST", "/v2/repository/nope", "no such repository endpoint", Family.REPOSITORY),
        ("POST", "/v2/repository/models/m/drop", "no such repository endpoint", Family.REPOSITORY),
        (
            "POST",
            "/v2/systemsharedmemory/register",
            "no such shared memory endpoint: /v2/systemsharedmemory/register",
            Family.SHARED_MEMORY,
        ),
        (
            "GET",
            "/v2/cudasharedmemory/region/r/nope",
            "no such shared memory endpoint: /v2/cudasharedmemory/region/r/nope",
            Family.SHARED_MEMORY,
        ),
        ("GET", "/v2/corral/status/x", "no such endpoint: /v2/corral/status/x", Family.STATUS),
    ],
)
def test_an_unknown_path_is_404_in_the_servers_words(
    method: str, path: str, message: str, family: Family | None
):
    with pytest.raises(NoRoute) as refused:
        match(method, path)
    assert (refused.value.status, str(refused.value)) == (404, message)
    assert refused.value.family is family
    assert refused.value.route is None


def test_the_status_page_routes_exist_only_where_the_page_is_served():
    assert match("GET", "/v2/corral/status").endpoint is Endpoint.STATUS
    with pytest.raises(NoRoute, match="no such endpoint: /v2/corral/status"):
        match("GET", "/v2/corral/status", status_page=False)
    with pytest.raises(NoRoute) as refused:
        match("POST", "/v2/corral/status", status_page=False)
    assert refused.value.status == 404


def test_only_the_health_checks_are_open():
    open_ = {endpoint for endpoint in Endpoint if endpoint.scope is None}
    assert open_ == {Endpoint.LIVE, Endpoint.READY}


segments = st.text(alphabet="ab/%?#.-_ é", max_size=12)


@given(method=st.sampled_from(["GET", "POST", "PUT"]), name=segments, tail=segments)
def test_the_busiest_route_shortcut_agrees_with_the_table(method: str, name: str, tail: str):
    for path in (f"/v2/models/{name}/infer", f"/v2/models/{name}/{tail}"):
        quick = infer_model(method, path)
        if quick is None:
            continue
        assert match(method, path) == Route(Endpoint.INFER, model=quick)


@given(target=st.text(alphabet="ab/%?#.-_é2", max_size=20))
def test_the_raw_target_shortcut_takes_only_what_the_decoded_path_names_the_same(target: str):
    raw = f"/v2/models/{target}/infer".encode()
    name = direct_infer_model(raw)
    if name is None:
        return
    # As a server decodes it for ASGI: the path without its query, percent-decoded.
    path = urllib.parse.unquote(raw.decode().partition("?")[0])
    assert infer_model("POST", path) == name
    assert match("POST", path) == Route(Endpoint.INFER, model=name)


@pytest.mark.parametrize(
    "target",
    [
        b"/v2/models/a%2Fb/infer",
        b"/v2/models/m/infer?x=1",
        b"/v2/models//infer",
        b"/v2/models/\xc3\xa9/infer",
    ],
)
def test_the_raw_target_shortcut_leaves_escapes_queries_and_odd_names_to_the_table(target: bytes):
    assert direct_infer_model(target) is None


@pytest.fixture
def host(repo: Path) -> Iterator[Host]:
    with Host(repo) as h:
        yield h


@pytest.mark.timeout(60)
def test_the_app_answers_every_endpoint_of_the_table(host: Host):
    """No endpoint of the table falls through to 'no such endpoint' in the app."""
    plane = DataPlane(host)
    app = HttpApp(
        plane, metrics=Metrics(plane).render, status=StatusBoard(plane, repository="models")
    )

    async def scenario() -> dict[str, tuple[int, str]]:
        transport = httpx.ASGITransport(app=app)
        answers = {}
        async with httpx.AsyncClient(transport=transport, base_url="http://corral") as client:
            for method, path, route in EXAMPLES:
                path = re.sub(r"/m(?=/|$)", "/mlp", path)
                body = b'{"inputs": []}' if route.endpoint is Endpoint.INFER else b""
                response = await client.request(method, path, content=body)
                answers[f"{method} {path}"] = (response.status_code, response.text)
        return answers

    answers = asyncio.run(scenario())
    unrouted = {
        request: answer
        for request, answer in answers.items()
        if "no such" in answer[1] or "internal error" in answer[1] or answer[0] == 405
    }
    assert not unrouted, unrouted
