"""The HTTP transport in-process: every endpoint through an ASGI transport, no sockets."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import numpy as np
import orjson
import pytest

import corral
from corral import Host, ModelState
from corral.protocol import DataPlane
from corral.server.bodies import BodyBudget
from corral.server.http.app import LOOP_SCOPE_KEY, HttpApp
from corral.server.observe.metrics import Metrics
from corral.testing import build_mlp, build_tree
from tests.gates import CallGate, answered_while_held, hold_filesystem
from tests.helpers import reference_run

X = np.random.default_rng(7).standard_normal((2, 4)).astype(np.float32)


def infer_body(x: np.ndarray = X, **extra: Any) -> dict[str, Any]:
    tensor = {"name": "X", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}
    return {"inputs": [tensor], **extra}


@pytest.fixture
def host(repo: Path) -> Iterator[Host]:
    with Host(repo) as h:
        yield h


def call(app: HttpApp, method: str, path: str, **kwargs: Any) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://corral") as client:
            return await client.request(method, path, **kwargs)

    return asyncio.run(go())


def make_app(host: Host, **options: Any) -> HttpApp:
    plane = DataPlane(host)
    return HttpApp(plane, metrics=Metrics(plane).render, **options)


def test_health_and_server_metadata(host: Host):
    app = make_app(host)
    assert call(app, "GET", "/v2/health/live").json() == {"live": True}
    assert call(app, "GET", "/v2/health/ready").json() == {"ready": True}
    meta = call(app, "GET", "/v2").json()
    assert (meta["name"], meta["version"]) == ("corral", corral.__version__)
    assert "binary_tensor_data" in meta["extensions"]
    host.close()
    response = call(app, "GET", "/v2/health/ready")
    assert (response.status_code, response.json()) == (503, {"ready": False})


def test_model_metadata_ready_and_config(host: Host):
    app = make_app(host)
    assert host.status("mlp").state is ModelState.UNLOADED
    ready = call(app, "GET", "/v2/models/mlp/ready")  # loads it
    assert (ready.status_code, ready.json()) == (200, {"name": "mlp", "ready": True})
    assert host.status("mlp").state is ModelState.READY
    assert call(app, "GET", "/v2/models/nope/ready").status_code == 404
    meta = call(app, "GET", "/v2/models/mlp").json()
    assert meta["inputs"] == [{"name": "X", "datatype": "FP32", "shape": [-1, 4]}]
    assert meta["platform"] == "onnxruntime_onnx"
    assert call(app, "GET", "/v2/models/mlp/versions/1").json() == meta
    assert call(app, "GET", "/v2/models/mlp/ready").status_code == 200
    config = call(app, "GET", "/v2/models/mlp/config").json()
    batching = config.pop("parameters")["corral.batching"]["string_value"]
    assert batching.startswith("batched (probed): ")
    assert config == {
        "name": "mlp",
        "platform": "onnxruntime_onnx",
        "backend": "onnxruntime",
        "max_batch_size": 64,
        "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [4], "format": "FORMAT_NONE"}],
        "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [1], "label_filename": ""}],
        "version_policy": {"latest": {"num_versions": 1}},
        "instance_group": [{"name": "mlp", "kind": "KIND_CPU", "count": 1}],
        "default_model_filename": "model.onnx",
        "dynamic_batching": {
            "max_queue_delay_microseconds": 0,
            "default_queue_policy": {
                "max_queue_size": 1024,
                "timeout_action": "REJECT",
                "default_timeout_microseconds": 0,
                "allow_timeout_override": False,
            },
        },
    }


def test_infer_with_json_tensors(host: Host):
    app = make_app(host)
    response = call(app, "POST", "/v2/models/mlp/infer", json=infer_body(id="req-7"))
    assert response.status_code == 200, response.text
    doc = response.json()
    assert (doc["model_name"], doc["model_version"], doc["id"]) == ("mlp", "1", "req-7")
    (output,) = doc["outputs"]
    assert (output["name"], output["datatype"], output["shape"]) == ("Y", "FP32", [2, 1])
    expected = reference_run(build_mlp(seed=1), {"X": X})[0]
    np.testing.assert_array_equal(np.array(output["data"], np.float32).reshape(2, 1), expected)


def test_infer_with_binary_tensors(host: Host):
    app = make_app(host)
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "X",
                    "datatype": "FP32",
                    "shape": [2, 4],
                    "parameters": {"binary_data_size": X.nbytes},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    )
    response = call(
        app,
        "POST",
        "/v2/models/tree/infer",
        content=header + X.tobytes(),
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert response.status_code == 200, response.text
    json_length = int(response.headers["inference-header-content-length"])
    doc = orjson.loads(response.content[:json_length])
    (output,) = doc["outputs"]
    assert output["parameters"]["binary_data_size"] == 8
    values = np.frombuffer(response.content[json_length:], np.float32).reshape(2, 1)
    np.testing.assert_array_equal(values, reference_run(build_tree(seed=2), {"X": X})[0])


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "message"),
    [
        ("POST", "/v2/models/mlp/infer", b"{not json", 400, ""),
        ("POST", "/v2/models/mlp/infer", orjson.dumps(infer_body(X[:, :3])), 400, "'X'"),
        ("POST", "/v2/models/nope/infer", orjson.dumps(infer_body()), 404, "nope"),
        ("POST", "/v2/models/mlp/versions/9/infer", orjson.dumps(infer_body()), 404, "9"),
        ("POST", "/v2/models/..%2Fetc/infer", orjson.dumps(infer_body()), 404, "no such"),
        ("POST", "/v2/models/%2E%2E/infer", orjson.dumps(infer_body()), 400, "'..'"),
        ("GET", "/v2/models/mlp/infer", b"", 405, "POST"),
        ("GET", "/v2/nothing", b"", 404, "no such endpoint"),
        ("GET", "/elsewhere", b"", 404, "no such endpoint"),
    ],
)
def test_errors_are_json_with_the_right_status(
    host: Host, method: str, path: str, body: bytes, status: int, message: str
):
    response = call(make_app(host), method, path, content=body)
    assert response.status_code == status, response.text
    assert message in response.json()["error"]


def test_bodies_over_the_limit_are_refused_with_413(host: Host):
    app = make_app(host, max_request_bytes=100)
    response = call(app, "POST", "/v2/models/mlp/infer", json=infer_body())
    assert response.status_code == 413
    assert "100 bytes" in response.json()["error"]


def test_a_request_timeout_gives_504(host: Host):
    app = make_app(host)
    assert call(app, "POST", "/v2/models/mlp/infer", json=infer_body()).status_code == 200
    late = infer_body(parameters={"timeout": 1})
    response = call(app, "POST", "/v2/models/mlp/infer", json=late)
    assert response.status_code == 504, response.text


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (corral.Overloaded("queue full"), 429),
        (corral.InferenceError("model raised"), 500),
        (corral.HostClosed("closing"), 503),
        (corral.ModelLoadError("cannot load"), 503),
        (corral.ModelInvalid("not ONNX"), 400),
        (corral.ModelTooLarge("larger than the whole budget"), 400),
        (corral.LoadRequestInvalid("config: not JSON"), 400),
    ],
)
def test_each_error_class_maps_to_its_status(
    host: Host, monkeypatch: pytest.MonkeyPatch, error: Exception, status: int
):
    async def failing(*args: object) -> None:
        raise error

    app = make_app(host)
    monkeypatch.setattr(app.plane, "infer", failing)
    response = call(app, "POST", "/v2/models/mlp/infer", json=infer_body())
    assert (response.status_code, response.json()) == (status, {"error": str(error)})


def test_statistics_repository_and_metrics(host: Host):
    app = make_app(host)
    for _ in range(2):
        assert call(app, "POST", "/v2/models/mlp/infer", json=infer_body()).status_code == 200
    (stats,) = call(app, "GET", "/v2/models/mlp/stats").json()["model_stats"]
    assert (stats["name"], stats["version"], stats["inference_count"]) == ("mlp", "1", 2)
    assert stats["inference_stats"]["success"]["count"] == 2
    assert len(call(app, "GET", "/v2/models/stats").json()["model_stats"]) == 1

    index = call(app, "POST", "/v2/repository/index").json()
    assert {"name": "mlp", "version": "1", "state": "READY"} in index
    assert call(app, "POST", "/v2/repository/index", json={"ready": True}).json() == [
        {"name": "mlp", "version": "1", "state": "READY"}
    ]
    assert call(app, "POST", "/v2/repository/models/tree/load").status_code == 200
    assert call(app, "GET", "/v2/models/tree/ready").status_code == 200
    assert call(app, "POST", "/v2/repository/models/tree/unload").status_code == 200
    assert call(app, "GET", "/v2/models/tree/ready").status_code == 503
    bad = call(app, "POST", "/v2/repository/index", content=b"[1]")
    assert bad.status_code == 400

    metrics = call(app, "GET", "/metrics")
    assert metrics.status_code == 200
    assert 'nv_inference_request_success{model="mlp",version="1"} 2' in metrics.text


def test_auth_token_guards_everything_but_health(host: Host):
    app = make_app(host, auth_token="s3cret")
    assert call(app, "GET", "/v2/health/live").status_code == 200
    for path in ["/v2", "/v2/models/mlp", "/metrics"]:
        refused = call(app, "GET", path)
        assert refused.status_code == 401, path
        assert refused.headers["www-authenticate"] == "Bearer"
        wrong = call(app, "GET", path, headers={"Authorization": "Bearer guess"})
        assert wrong.status_code == 401, path
        assert call(app, "GET", path, headers={"Authorization": "Bearer s3cret"}).is_success


def test_concurrent_requests_each_get_their_own_outputs(host: Host):
    # 200 requests in flight at once on one event loop, batched by the scheduler: each
    # answer must be the one for its own input, and every one counted once.
    app = make_app(host)
    rng = np.random.default_rng(9)
    inputs = [rng.standard_normal((1, 4)).astype(np.float32) for _ in range(200)]

    async def go() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://corral") as client:
            return await asyncio.gather(
                *(client.post("/v2/models/mlp/infer", json=infer_body(x)) for x in inputs)
            )

    responses = asyncio.run(go())
    batched = np.concatenate(inputs)
    expected = reference_run(build_mlp(seed=1), {"X": batched})[0]
    for index, response in enumerate(responses):
        assert response.status_code == 200, response.text
        data = response.json()["outputs"][0]["data"]
        np.testing.assert_allclose(data, expected[index], rtol=1e-6)
    (stats,) = asyncio.run(DataPlane(host).model_statistics("mlp"))
    assert stats.queue.count == 200  # the queue saw each request once
    assert stats.execution_count < 200  # and ran them in batches


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("method", "path", "what", "status"),
    [
        ("POST", "/v2/repository/index", "listing", 200),
        ("GET", "/v2/models/tree/ready", "files", 200),
        ("GET", "/v2/models/tree/stats", "files", 200),
        ("GET", "/v2/models/tree", "load", 200),
        ("GET", "/v2/models/tree/config", "load", 200),
        ("POST", "/v2/models/tree/infer", "files", 200),
        ("GET", "/metrics", "scrape", 200),
    ],
    ids=["index", "ready", "stats", "metadata", "config", "cold-infer", "metrics"],
)
def test_a_slow_filesystem_holds_up_only_the_requests_that_need_it(
    host: Host, monkeypatch: pytest.MonkeyPatch, method: str, path: str, what: str, status: int
):
    # One client waits on the repository (a listing, a model's files, a load) or on a scrape
    # while another's request for a loaded model is answered: the event loop stays free.
    plane = DataPlane(host)
    app = HttpApp(plane, metrics=Metrics(plane).render)
    assert call(app, "POST", "/v2/models/mlp/infer", json=infer_body()).status_code == 200
    gate = CallGate()
    hold_filesystem(monkeypatch, plane, gate, what)
    body = infer_body() if path.endswith("/infer") else None

    async def go() -> tuple[httpx.Response, httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://corral") as client:
            return await answered_while_held(
                gate,
                lambda: client.request(method, path, json=body),
                lambda: client.post("/v2/models/mlp/infer", json=infer_body()),
            )

    fast, slow = asyncio.run(go())
    assert fast.status_code == 200, fast.text
    assert slow.status_code == status, slow.text


async def _drive(app: HttpApp, scope: dict[str, Any], incoming: list[dict[str, Any]]) -> list[Any]:
    """Run ``app`` on one ASGI scope fed ``incoming`` messages; what it sent, in order."""
    sent: list[Any] = []
    queue = list(incoming)

    async def receive() -> dict[str, Any]:
        return queue.pop(0)

    async def send(message: Any) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent


def test_an_inference_takes_its_event_loop_from_the_scope_when_the_server_gives_it(
    host: Host, monkeypatch: pytest.MonkeyPatch
):
    # corral serve's connections give the loop (LOOP_SCOPE_KEY): asking asyncio for it costs
    # a getpid() system call per request on Python 3.11. Here asking fails, so only a
    # request whose scope gives the loop can be answered.
    def no_asking() -> None:
        raise RuntimeError("asyncio.get_running_loop() was called")

    monkeypatch.setattr(corral._host.served, "asyncio", SimpleNamespace(get_running_loop=no_asking))
    app = make_app(host)
    body = orjson.dumps(infer_body())
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]

    async def infer(give_loop: bool) -> tuple[int, bytes]:
        scope: dict[str, Any] = {
            "type": "http",
            "method": "POST",
            "path": "/v2/models/mlp/infer",
            "query_string": b"",
            "headers": headers,
        }
        if give_loop:
            scope[LOOP_SCOPE_KEY] = asyncio.get_running_loop()
        sent = await _drive(app, scope, [{"type": "http.request", "body": body}])
        return sent[0]["status"], sent[1]["body"]

    status, answer = asyncio.run(infer(give_loop=True))
    assert status == 200, answer
    expected = reference_run(build_mlp(seed=1), {"X": X})[0]
    np.testing.assert_allclose(
        orjson.loads(answer)["outputs"][0]["data"], expected.ravel(), rtol=1e-6
    )
    status, answer = asyncio.run(infer(give_loop=False))
    assert status == 500
    assert b"get_running_loop() was called" in answer


def test_the_lifespan_protocol_is_acknowledged_and_leaves_the_host_serving(host: Host):
    # Whoever runs the app owns the Host: a server's lifespan shutdown does not close it.
    sent = asyncio.run(
        _drive(
            make_app(host),
            {"type": "lifespan", "asgi": {"version": "3.0"}},
            [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}],
        )
    )
    assert [m["type"] for m in sent] == [
        "lifespan.startup.complete",
        "lifespan.shutdown.complete",
    ]
    assert host.state is corral.HostState.RUNNING


def test_a_client_that_goes_away_mid_body_gets_400_and_its_bytes_are_given_back(host: Host):
    budget = BodyBudget(10_000)
    app = make_app(host, body_budget=budget)
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v2/models/mlp/infer",
        "headers": [(b"content-length", b"1000")],
    }
    incoming = [
        {"type": "http.request", "body": b'{"inputs": [', "more_body": True},
        {"type": "http.disconnect"},
    ]
    sent = asyncio.run(_drive(app, scope, incoming))
    assert sent[0]["status"] == 400
    assert orjson.loads(sent[1]["body"]) == {
        "error": "the client went away before sending the whole body"
    }
    assert budget.held == 0
    assert host.stats().loaded_versions == 0  # nothing was run on half a body


def test_metrics_not_enabled_are_404(host: Host):
    app = HttpApp(DataPlane(host))
    response = call(app, "GET", "/metrics")
    assert (response.status_code, response.json()) == (404, {"error": "metrics are not enabled"})


def test_an_unexpected_error_is_a_logged_500_that_names_it(host: Host, caplog):
    def broken_metrics() -> tuple[bytes, str]:
        raise ZeroDivisionError("a bug")

    app = HttpApp(DataPlane(host), metrics=broken_metrics)
    response = call(app, "GET", "/metrics")
    assert response.status_code == 500
    assert response.json() == {"error": "internal error: ZeroDivisionError('a bug')"}
    (record,) = [r for r in caplog.records if r.getMessage() == "corral: GET /metrics failed"]
    assert record.exc_info is not None
    assert isinstance(record.exc_info[1], ZeroDivisionError)
    assert call(app, "GET", "/v2/health/live").json() == {"live": True}


@pytest.mark.parametrize(
    "spell",
    [
        lambda n: "+" + n,
        lambda n: n[0] + "_" + n[1:],
        lambda n: " " + n,
        lambda n: "\uff11" + n,  # a fullwidth digit one
        lambda n: "9" * 5000,
    ],
    ids=["sign", "underscore", "space", "fullwidth", "5000-digits"],
)
def test_a_header_length_int_would_read_loosely_is_refused_with_400(
    host: Host, spell: Callable[[str], str]
):
    # int() takes a sign, underscores, spaces, other scripts' digits, and refuses 4,300+
    # digits with a ValueError: the header takes ASCII digits only, and says so.
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "X",
                    "datatype": "FP32",
                    "shape": [2, 4],
                    "parameters": {"binary_data_size": X.nbytes},
                }
            ]
        }
    )
    response = call(
        make_app(host),
        "POST",
        "/v2/models/mlp/infer",
        content=header + X.tobytes(),
        headers=[(b"Inference-Header-Content-Length", spell(str(len(header))).encode())],
    )
    assert response.status_code == 400, response.text
    assert "inference-header-content-length must be" in response.json()["error"]
