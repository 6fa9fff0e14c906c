"""Web pages cannot drive the server: the Host allow-list, a POST's Origin and Content-Type.

Over the ASGI app, at a socket for the direct route (which must refuse what the ASGI path
refuses), and end to end: tritonclient's HTTP client and curl still work against a real
``corral serve`` bound to loopback, while a rebound name and another site's page do not.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest

from corral import Host, ModelState
from corral.protocol import DataPlane
from corral.server.connections.contract import ConnectionLimits
from corral.server.connections.edge import protocol_for
from corral.server.connections.server import EdgeServer
from corral.server.http.app import HttpApp
from corral.server.http.metrics_port import MetricsApp
from corral.server.http.origins import SitePolicy, host_name, is_loopback
from corral.server.observe.metrics import Metrics
from corral.server.settings import ServerSettings
from tests.processes import ServerProcess, start_server, stop_server

# tritonclient's HTTP client is gevent-based: collected on another thread, it fails there.
pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.usefixtures("garbage_collected_on_the_main_thread"),
]

X = np.random.default_rng(5).standard_normal((2, 4)).astype(np.float32)
BODY = orjson.dumps(
    {"inputs": [{"name": "X", "datatype": "FP32", "shape": [2, 4], "data": X.ravel().tolist()}]}
)
LOOPBACK = SitePolicy.for_address("127.0.0.1", None)
EVIL = "evil.example:8000"


@pytest.fixture
def host(repo: Path) -> Iterator[Host]:
    with Host(repo) as h:
        yield h


def make_app(host: Host, sites: SitePolicy | None = LOOPBACK) -> HttpApp:
    plane = DataPlane(host)
    return HttpApp(plane, metrics=Metrics(plane).render, sites=sites)


def call(
    app: Any, method: str, path: str, headers: dict[str, str] | None = None, **kwargs: Any
) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://localhost:8000"
        ) as client:
            return await client.request(method, path, headers=headers, **kwargs)

    return asyncio.run(go())


# -- the policy --------------------------------------------------------------------------


def test_host_names_and_the_default_by_bind_address():
    assert host_name("LocalHost:8000") == "localhost"
    assert host_name("[::1]:8000") == host_name("[::1]") == host_name("::1") == "::1"
    assert host_name("127.0.0.1") == "127.0.0.1"
    for bad in ("", "a b", "[::1", "host:port", "a/b", "x@y", "[::1]x"):
        assert host_name(bad) is None, bad
    assert is_loopback("127.0.0.1")
    assert is_loopback("::1")
    assert is_loopback("localhost")
    assert not is_loopback("0.0.0.0")
    assert not is_loopback("10.1.2.3")
    assert LOOPBACK.allows("localhost:1234")
    assert LOOPBACK.allows("[::1]:8000")
    assert not LOOPBACK.allows(EVIL)
    assert not LOOPBACK.allows("127.0.0.1.evil.example")
    assert SitePolicy.for_address("0.0.0.0", None).allows(EVIL)
    assert SitePolicy.for_address("127.0.0.2", None).allows("127.0.0.2:8000")
    listed = SitePolicy.for_address("0.0.0.0", ["models.example", "*.corp.example"])
    assert listed.allows("models.example:80")
    assert listed.allows("a.b.corp.example")
    assert listed.allows("corp.example")
    assert not listed.allows("localhost")
    assert SitePolicy(["*"]).allows(EVIL)


def test_allowed_hosts_setting_is_read_and_checked(tmp_path: Path):
    settings = ServerSettings(repository=tmp_path, allowed_hosts="a.example, b.example")
    assert settings.allowed_hosts == ("a.example", "b.example")
    assert settings.site_policy().allows("b.example:9") is True
    assert not settings.site_policy().allows("localhost")
    assert not ServerSettings(repository=tmp_path).site_policy().allows(EVIL)
    assert ServerSettings(repository=tmp_path, host="0.0.0.0").site_policy().allows(EVIL)
    with pytest.raises(ValueError, match="'a b' is not a host name"):
        ServerSettings(repository=tmp_path, allowed_hosts="ok.example,a b")
    with pytest.raises(ValueError, match="names no host"):
        ServerSettings(repository=tmp_path, allowed_hosts=" , ")


# -- over the ASGI app -------------------------------------------------------------------


def test_a_rebound_name_reads_nothing(host: Host):
    app = make_app(host)
    for path in ("/v2/corral/status", "/metrics", "/v2", "/v2/models/mlp/config", "/nope"):
        refused = call(app, "GET", path, {"host": EVIL})
        assert refused.status_code == 421, path
        assert "'evil.example:8000'" in refused.json()["error"]
        assert "allowed_hosts" in refused.json()["error"]
    assert call(app, "POST", "/v2/models/mlp/infer", {"host": EVIL}, content=BODY).status_code == (
        421
    )
    assert host.status("mlp").state is ModelState.UNLOADED  # the refused inference loaded nothing
    # The server's own names, with any port; the health checks answer any name.
    assert call(app, "GET", "/metrics", {"host": "127.0.0.1:9"}).status_code == 200
    assert call(app, "GET", "/v2", {"host": "[::1]:8000"}).status_code == 200
    assert call(app, "GET", "/v2/health/ready", {"host": EVIL}).status_code == 200
    # Without a policy (the app alone, as Ray's replicas run it): any name.
    assert call(make_app(host, None), "GET", "/v2", {"host": EVIL}).status_code == 200


def test_another_sites_page_cannot_post(host: Host):
    app = make_app(host)
    for origin in ("http://evil.example", "null", "http://localhost:8001", "file://"):
        refused = call(app, "POST", "/v2/models/mlp/infer", {"origin": origin}, content=BODY)
        assert refused.status_code == 403, origin
        assert repr(origin) in refused.json()["error"]
        load = call(app, "POST", "/v2/repository/models/mlp/load", {"origin": origin})
        assert load.status_code == 403
    assert host.status("mlp").state is ModelState.UNLOADED
    assert call(app, "POST", "/v2/repository/models/mlp/load").status_code == 200
    unload = call(app, "POST", "/v2/repository/models/mlp/unload", {"origin": "http://evil.x"})
    assert unload.status_code == 403
    assert host.status("mlp").state is ModelState.READY
    register = call(
        app,
        "POST",
        "/v2/systemsharedmemory/region/r/register",
        {"origin": "http://evil.example"},
        json={"key": "/r", "offset": 0, "byte_size": 8},
    )
    assert register.status_code == 403
    # The server's own pages may (http or https: a proxy may end TLS), and so may a GET.
    for own in ("http://localhost:8000", "https://localhost:8000", "HTTP://LOCALHOST:8000"):
        answer = call(app, "POST", "/v2/models/mlp/infer", {"origin": own}, content=BODY)
        assert answer.status_code == 200, own
    ready = call(app, "GET", "/v2/models/mlp/ready", {"origin": "http://evil.example"})
    assert ready.status_code == 200


def test_a_browsers_simple_content_types_are_refused(host: Host):
    app = make_app(host)
    path = "/v2/models/mlp/infer"
    plain = call(app, "POST", path, {"content-type": "text/plain;charset=UTF-8"}, content=BODY)
    assert plain.status_code == 415
    assert "text/plain" in plain.json()["error"]
    load = call(app, "POST", "/v2/repository/models/mlp/load", {"content-type": "text/plain"})
    assert load.status_code == 415
    assert host.status("mlp").state is ModelState.UNLOADED
    for marks in ({"referer": "http://evil.example/"}, {"sec-fetch-site": "same-origin"}):
        for media in ("application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
            refused = call(app, "POST", path, {"content-type": media, **marks}, content=BODY)
            assert refused.status_code == 415, (media, marks)
            assert media.split(";")[0] in refused.json()["error"]
    # What clients of the protocol send: curl -d's form type, none, octet-stream, JSON.
    for media in ("application/x-www-form-urlencoded", "application/json", None):
        headers = {} if media is None else {"content-type": media}
        assert call(app, "POST", path, headers, content=BODY).status_code == 200, media


def test_the_metrics_port_holds_the_host_too(host: Host):
    app = MetricsApp(Metrics(DataPlane(host)).render, LOOPBACK)
    refused = call(app, "GET", "/metrics", {"host": EVIL})
    assert refused.status_code == 421
    assert "evil.example" in refused.json()["error"]
    assert call(app, "GET", "/metrics").status_code == 200


# -- the direct route, at a socket -------------------------------------------------------


class Recording:
    """The app, noting which way each request went (the direct route, or ASGI)."""

    def __init__(self, app: HttpApp) -> None:
        self.app = app
        self.ways: list[str] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.ways.append("asgi")
        await self.app(scope, receive, send)

    async def answer_infer(self, *args: Any, **kwargs: Any) -> tuple[int, bytes, bytes]:
        self.ways.append("direct")
        answer: tuple[int, bytes, bytes] = await self.app.answer_infer(*args, **kwargs)
        return answer

    def hold_body(self, declared: int) -> Any:
        return self.app.hold_body(declared)


LIMITS = ConnectionLimits(8192, 65536, 10.0, 10.0, 64, 30.0)


async def exchange(port: int, headers: str) -> tuple[int, dict[str, Any]]:
    """One inference POST with ``headers`` (CRLF-ended lines) on a new connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(
            b"POST /v2/models/mlp/infer HTTP/1.1\r\n"
            + headers.encode()
            + b"content-length: %d\r\nconnection: close\r\n\r\n" % len(BODY)
            + BODY
        )
        answer = await reader.read()
    finally:
        writer.close()
        await writer.wait_closed()
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), orjson.loads(body)


def test_the_direct_route_refuses_what_the_asgi_route_refuses(host: Host):
    recording = Recording(make_app(host))

    async def go() -> list[tuple[int, dict[str, Any]]]:
        server = EdgeServer(
            recording, "127.0.0.1", 0, protocol_for(LIMITS, recording), drain_margin_s=5
        )
        port = await server.start()
        try:
            return [
                await exchange(port, f"host: {EVIL}\r\n"),
                await exchange(port, "host: localhost\r\norigin: http://evil.example\r\n"),
                await exchange(port, "host: localhost\r\ncontent-type: text/plain\r\n"),
                await exchange(
                    port, f"host: 127.0.0.1:{port}\r\norigin: http://127.0.0.1:{port}\r\n"
                ),
            ]
        finally:
            await server.stop()

    (rebound, cross, plain, own) = asyncio.run(go())
    assert recording.ways == ["direct"] * 4  # each took the direct route
    assert rebound[0] == 421
    assert "evil.example" in rebound[1]["error"]
    assert cross[0] == 403
    assert "http://evil.example" in cross[1]["error"]
    assert plain[0] == 415
    assert "text/plain" in plain[1]["error"]
    assert own[0] == 200
    assert own[1]["outputs"][0]["name"] == "Y"


# -- end to end: tritonclient and curl still work ------------------------------------------


@pytest.fixture
def server(repo: Path, tmp_path: Path) -> Iterator[ServerProcess]:
    served = start_server(repo, tmp_path / "serve.log")
    yield served
    stop_server(served)


def curl(url: str, *args: str) -> tuple[int, bytes]:
    done = subprocess.run(
        ["curl", "-sS", "--max-time", "20", "-o", "-", "-w", "\n%{http_code}", *args, url],
        capture_output=True,
        check=True,
        timeout=30,
    )
    body, _, code = done.stdout.rpartition(b"\n")
    return int(code), body


@pytest.mark.timeout(120)
def test_tritonclient_and_curl_still_work(server: ServerProcess):
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(server.http)
    try:
        for binary in (False, True):
            tensor = httpclient.InferInput("X", [2, 4], "FP32")
            tensor.set_data_from_numpy(X, binary_data=binary)
            wanted = httpclient.InferRequestedOutput("Y", binary_data=binary)
            assert client.infer("mlp", [tensor], outputs=[wanted]).as_numpy("Y").shape == (2, 1)
        client.unload_model("mlp")
        client.load_model("mlp")
        assert client.is_model_ready("mlp")
    finally:
        client.close()
    base = f"http://{server.http}"
    code, body = curl(f"{base}/v2/models/mlp/infer", "-d", BODY.decode())
    assert code == 200
    assert b'"outputs"' in body
    code, body = curl(f"{base}/v2/repository/models/tree/load", "-X", "POST")
    assert code == 200
    code, body = curl(f"{base}/metrics", "-H", f"Host: {EVIL}")
    assert code == 421
    assert b"evil.example" in body
    code, body = curl(f"{base}/v2/corral/status", "-H", "Host: localhost")
    assert code == 200
    refused = ("-H", "Origin: http://evil.example", "-d", BODY.decode())
    code, body = curl(f"{base}/v2/models/mlp/infer", *refused)
    assert code == 403
    assert b"http://evil.example" in body
