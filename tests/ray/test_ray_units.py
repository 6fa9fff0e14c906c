"""corral.ray's parts without a Ray cluster: the exchange, the config, the ingress, a replica.

Ray itself is replaced at its interface: the replica's ``serve`` functions (replica context,
multiplexing, the request's model id) by a stand-in, the ingress's deployment handle by one
that calls a replica directly. What Ray does with them is `tests/ray/test_ray_serve.py`'s part.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import httpx
import numpy as np
import orjson
import pytest

pytest.importorskip("ray.serve", reason="the ray extra is not installed")

from ray.exceptions import RayError
from ray.serve.exceptions import BackPressureError
from starlette.requests import Request

import corral
import corral.ray._replica as replica_module
from corral import Host, ModelState
from corral._host.budget import estimate_footprint_bytes, estimate_model_bytes
from corral._onnx.modelfile import read_footprint
from corral.protocol import DataPlane
from corral.protocol.proto import grpc_service_pb2 as pb
from corral.protocol.proto import grpc_service_pb2_grpc as pb_grpc
from corral.ray import (
    UNLIMITED,
    GrpcAnswer,
    GrpcCall,
    GrpcIngress,
    GrpcListener,
    HttpAnswer,
    HttpCall,
    ModelReplica,
    RayServeConfig,
    ReplicasWanted,
    V2Ingress,
    app,
    build_app,
    call_asgi,
    call_handlers,
    model_in_path,
    models_per_replica,
    replica_signals,
)
from corral.ray._app import grpc_listener, most_replicas, replica_count
from corral.ray._autoscaling import PRESSURE, QUEUED
from corral.ray._fanout import (
    FanoutError,
    GrpcFailed,
    GrpcReply,
    Reply,
    all_succeeded,
    every_status,
    grpc_all_succeeded,
    grpc_merged_index,
    grpc_summed_statistics,
    labelled_metrics,
    merged_index,
    passed_answer,
    summed_statistics,
)
from corral.ray._spreading import HotModels
from corral.server.grpc.service import InferenceServicer, method_handlers, start_grpc_server
from corral.server.http.app import HttpApp
from corral.server.observe.logs import REQUEST_ID_HEADER
from corral.testing import build_mlp, build_tree
from tests.gates import hold_compute_workers, served_version
from tests.helpers import add_model, reference_run, run_freeing_frames

X = np.random.default_rng(5).standard_normal((2, 4)).astype(np.float32)
TREE = build_tree(seed=2)


def infer_call(name: str, x: np.ndarray = X, **headers: str) -> HttpCall:
    tensor = {"name": "X", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}
    body = orjson.dumps({"inputs": [tensor]})
    header_list = [(b"content-type", b"application/json")]
    header_list += [(k.encode(), v.encode()) for k, v in headers.items()]
    return HttpCall("POST", f"/v2/models/{name}/infer", b"", tuple(header_list), body)


# -- the exchange ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "model"),
    [
        ("/v2/models/fraud/infer", "fraud"),
        ("/v2/models/fraud", "fraud"),
        ("/v2/models/fraud/versions/2/ready", "fraud"),
        ("/v2/models/stats", None),
        ("/v2/models/", None),
        ("/v2/models", None),
        ("/v2/health/ready", None),
        ("/v2", None),
        ("/metrics", None),
        ("/v1/models/fraud", None),
        # Taken from the route table: only an endpoint's path names a model.
        ("/v2/models/fraud/config", "fraud"),
        ("/v2/models/fraud/nope/more", None),
        ("/v2/corral/status/models/fraud", None),
        ("/v2/repository/models/fraud/load", None),
    ],
)
def test_model_in_path(path: str, model: str | None):
    assert model_in_path(path) == model


def test_call_asgi_answers_as_the_http_app_does_over_a_transport(repo: Path):
    with Host(repo) as host:
        http_app = HttpApp(DataPlane(host))
        calls = [
            infer_call("tree"),
            infer_call("nope"),
            HttpCall("GET", "/v2/models/mlp", b"", (), b""),
            HttpCall("DELETE", "/v2/models/mlp", b"", (), b""),
        ]

        async def both(call: HttpCall) -> tuple[HttpAnswer, httpx.Response]:
            direct = await call_asgi(http_app, call)
            transport = httpx.ASGITransport(app=http_app)
            async with httpx.AsyncClient(transport=transport, base_url="http://c") as client:
                over = await client.request(
                    call.method, call.path, content=call.body, headers=list(call.headers)
                )
            return direct, over

        for call in calls:
            direct, over = asyncio.run(both(call))
            assert direct.status == over.status_code, call.path
            assert direct.body == over.content, call.path
            assert dict(direct.headers)[b"content-type"] == over.headers["content-type"].encode()
        answer = asyncio.run(call_asgi(http_app, calls[0]))
        outputs = orjson.loads(answer.body)["outputs"][0]
        expected = reference_run(TREE, {"X": X})[0]
        np.testing.assert_allclose(np.array(outputs["data"]).reshape(outputs["shape"]), expected)


def test_call_asgi_refuses_an_app_that_never_answers():
    async def silent(scope: Any, receive: Any, send: Any) -> None:
        await receive()

    with pytest.raises(RuntimeError, match="sent no response to GET /v2"):
        asyncio.run(call_asgi(silent, HttpCall("GET", "/v2", b"", (), b"")))


# -- the config ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"replicas": 0}, "replicas must be a positive integer"),
        ({"max_ongoing_requests": -1}, "max_ongoing_requests must be a positive integer"),
        ({"ingress_replicas": 1.5}, "ingress_replicas must be a positive integer"),
        ({"replica_cpus": -0.5}, "replica_cpus must be >= 0"),
        ({"drain_timeout_s": float("nan")}, "drain_timeout_s must be >= 0"),
        ({"max_models_per_replica": 0}, "max_models_per_replica must be a positive integer or -1"),
        ({"max_loaded_models": 0}, "max_loaded_models must be a positive integer"),
        ({"compute_workers": True}, "compute_workers must be a positive integer"),
        ({"memory_budget": "lots"}, "is not a size"),
        ({"max_request_bytes": 0}, "max_request_bytes must be a positive integer"),
        ({"max_queue_per_model": 0}, "max_queue_per_model must be a positive integer"),
        ({"hot_model_in_flight": -1}, "hot_model_in_flight must be a whole number, 0 or more"),
        ({"grpc_port": 70000}, "grpc_port must be a port number, 0 .any free port. or -1"),
        ({"grpc_port": "8001"}, "grpc_port must be a port number"),
        (
            {"grpc_port": 0, "ingress_replicas": 2},
            "grpc_port 0 takes a free port per ingress replica: give a port for 2",
        ),
        ({"grpc_host": ""}, "grpc_host must be an address"),
    ],
)
def test_config_refuses_bad_values_by_name(options: dict[str, Any], message: str):
    with pytest.raises(ValueError, match=message):
        RayServeConfig(**options)


def test_config_from_a_mapping_names_unknown_keys():
    assert RayServeConfig.from_mapping({"replicas": 3}).replicas == 3
    with pytest.raises(ValueError, match="unknown option\\(s\\) budget, replica; known: "):
        RayServeConfig.from_mapping({"replica": 3, "budget": "1GiB"})


@pytest.mark.parametrize(
    ("cpus", "workers", "expected"),
    [(1.0, None, 1), (0.5, None, 1), (2.5, None, 3), (0, None, 1), (1.0, 4, 4)],
)
def test_compute_workers_follow_the_cpus_ray_reserves(
    cpus: float, workers: int | None, expected: int
):
    config = RayServeConfig(replica_cpus=cpus, compute_workers=workers)
    assert config.replica_compute_workers == expected


def test_the_routing_count_follows_the_budget(repo: Path):
    paths = [repo / name / "1" / "model.onnx" for name in ("mlp", "tree")]
    mean = sum(estimate_footprint_bytes(read_footprint(path)) for path in paths) // 2
    assert models_per_replica(repo, RayServeConfig(memory_budget=10 * mean)) == 10
    assert models_per_replica(repo, RayServeConfig(memory_budget=10 * mean + mean - 1)) == 10
    # A budget below one model still routes one model: the Host then says it is too large.
    assert models_per_replica(repo, RayServeConfig(memory_budget=1)) == 1
    both = RayServeConfig(memory_budget=10 * mean, max_loaded_models=4)
    assert models_per_replica(repo, both) == 4
    assert models_per_replica(repo, RayServeConfig(max_loaded_models=7)) == 7
    assert models_per_replica(repo, RayServeConfig(max_models_per_replica=3)) == 3
    assert models_per_replica(repo, RayServeConfig()) == UNLIMITED


def test_the_routing_count_of_an_empty_repository_is_finite(tmp_path: Path):
    size = estimate_model_bytes(0)
    assert models_per_replica(tmp_path, RayServeConfig(memory_budget=5 * size)) == 5


def test_the_application_and_its_builder(repo: Path):
    application = build_app(repo, RayServeConfig(replicas=3))
    assert type(application).__name__ == "Application"
    assert type(app({"repository": str(repo), "replicas": 2})).__name__ == "Application"
    with pytest.raises(ValueError, match=r"needs args\.repository"):
        app({"replicas": 2})
    with pytest.raises(ValueError, match="unknown option\\(s\\) replica"):
        app({"repository": str(repo), "replica": 2})


def test_with_max_replicas_the_models_scale_on_corrals_policy(repo: Path):
    scaling = replica_count(RayServeConfig(replicas=2, max_replicas=5))
    assert scaling == {
        "autoscaling_config": {
            "min_replicas": 2,
            "initial_replicas": 2,
            "max_replicas": 5,
            "policy": {
                "policy_function": "corral.ray._autoscaling:ReplicasWanted",
                "policy_kwargs": {"queued_per_replica": 16.0},
            },
        }
    }
    assert replica_count(RayServeConfig(replicas=3)) == {"num_replicas": 3}
    # The ingress may carry what the most replicas work on.
    assert most_replicas(RayServeConfig(replicas=2, max_replicas=5)) == 5
    assert most_replicas(RayServeConfig(replicas=3)) == 3
    # Ray takes the configuration as it builds the application.
    scaled = build_app(repo, RayServeConfig(replicas=2, max_replicas=5))
    assert type(scaled).__name__ == "Application"
    with pytest.raises(ValueError, match=r"max_replicas \(1\) must be at least replicas \(2\)"):
        RayServeConfig(replicas=2, max_replicas=1)
    with pytest.raises(ValueError, match="queued_per_replica must be a number above 0"):
        RayServeConfig(queued_per_replica=0)


def _context(queued: list[float], pressure: list[float], current: int = 2) -> SimpleNamespace:
    """What Ray's AutoscalingContext gives the policy: each figure by replica."""
    return SimpleNamespace(
        aggregated_metrics={
            QUEUED: dict(enumerate(queued)),
            PRESSURE: dict(enumerate(pressure)),
        },
        current_num_replicas=current,
    )


def test_the_policy_follows_queued_requests_and_memory_pressure():
    policy = ReplicasWanted(queued_per_replica=10)
    assert policy(_context([0, 0], [0.1, 0.2])) == (1, {})  # idle: Ray holds its minimum
    assert policy(_context([25, 10], [0.1, 0.2])) == (4, {})  # 35 queued, 10 a replica
    assert policy(_context([0, 0], [0.95, 0.3])) == (3, {})  # a replica past 0.9: one more
    assert policy(_context([0, 0], [0.7, 0.3])) == (2, {})  # past 0.6: none fewer
    assert policy(_context([50, 0], [0.95, 0.3])) == (5, {})  # the larger count wins
    nothing = SimpleNamespace(aggregated_metrics=None, current_num_replicas=3)
    assert policy(nothing) == (1, {})  # no figures yet: nothing asks for more


def test_a_replica_reports_its_queued_requests_and_memory_pressure(tmp_path: Path):
    add_model(tmp_path, "slow", build_mlp(seed=3), toml="max_batch_size = 0\n")
    add_model(tmp_path, "mlp", build_mlp(seed=4), toml="max_batch_size = 0\n")
    x = {"X": np.ones((1, 4), np.float32)}
    with Host(tmp_path, memory_budget="64MiB") as host:
        assert host.preload() == {}
        idle = replica_signals(host)
        assert idle[QUEUED] == 0
        assert idle[PRESSURE] == pytest.approx(host.stats().bytes_used / (64 << 20))
        gate, blockers = hold_compute_workers(host)
        try:
            queued = [host.submit("mlp", x) for _ in range(3)]
            assert replica_signals(host)[QUEUED] == 3
        finally:
            gate.open.set()
        for future in [*blockers, *queued]:
            future.result(timeout=30)
    # With a memory watch, the working set against the limit counts too.
    with Host(tmp_path, memory_watch_s=3600) as host:
        host.load("mlp")
        stats = host.stats()
        assert stats.memory_in_use is not None
        assert stats.memory_limit is not None
        share = stats.memory_in_use / stats.memory_limit
        assert replica_signals(host)[PRESSURE] == pytest.approx(share, rel=0.2)


# -- a replica, with Ray's serve functions stood in for ----------------------------------------


class FakeServe:
    """What ModelReplica asks of ``ray.serve``: its context, multiplexing, the model id."""

    def __init__(self) -> None:
        self.model_id = ""
        self.counts: list[int] = []
        # The routing entries the "cache" holds, by model, as Ray's multiplexer keeps them.
        self.routed: dict[str, Any] = {}

        self.tag = "replica-1"

    def get_replica_context(self) -> SimpleNamespace:
        return SimpleNamespace(replica_tag=self.tag)

    def get_multiplexed_model_id(self) -> str:
        return self.model_id

    def multiplexed(
        self, max_num_models_per_replica: int
    ) -> Callable[[Callable[[str], Awaitable[Any]]], Callable[[str], Awaitable[Any]]]:
        self.counts.append(max_num_models_per_replica)

        def decorate(load: Callable[[str], Awaitable[Any]]) -> Callable[[str], Awaitable[Any]]:
            async def cached(name: str) -> Any:
                if name not in self.routed:
                    self.routed[name] = await load(name)
                return self.routed[name]

            return cached

        return decorate

    def evict(self, name: str) -> None:
        """What Ray's multiplexer does to an entry it pushes out."""
        entry = self.routed.pop(name)
        entry.__del__()


@pytest.fixture
def fake_serve(monkeypatch: pytest.MonkeyPatch) -> FakeServe:
    fake = FakeServe()
    monkeypatch.setattr(replica_module, "serve", fake)
    return fake


@pytest.fixture
def replica(repo: Path, fake_serve: FakeServe) -> Iterator[ModelReplica]:
    config = RayServeConfig(compute_workers=os.cpu_count() or 1, max_models_per_replica=5)
    made = ModelReplica(str(repo), config)
    yield made
    made.__del__()


def forward(replica: ModelReplica, fake: FakeServe, call: HttpCall) -> HttpAnswer:
    fake.model_id = model_in_path(call.path) or ""
    return asyncio.run(replica(call))


def test_a_replica_answers_routes_known_models_and_names_itself(
    replica: ModelReplica, fake_serve: FakeServe
):
    assert fake_serve.counts == [5]
    # What Ray's autoscaling reads of it: nothing queued, no pressure without a budget.
    assert replica.record_autoscaling_stats() == replica_signals(replica.host)
    answer = forward(replica, fake_serve, infer_call("tree"))
    assert answer.status == 200
    assert (b"corral-replica", b"replica-1") in answer.headers
    assert list(fake_serve.routed) == ["tree"]
    missing = forward(replica, fake_serve, infer_call("nope"))
    assert missing.status == 404
    assert b"Request for unknown model: 'nope' is not found" in missing.body
    bad = forward(replica, fake_serve, infer_call("..%2Fetc"))
    assert bad.status == 400
    health = forward(replica, fake_serve, HttpCall("GET", "/v2/health/ready", b"", (), b""))
    assert health.status == 200
    # Unknown names get no route: they would crowd Ray's count.
    assert list(fake_serve.routed) == ["tree"]


def test_ray_evicting_a_route_never_closes_a_model_under_a_run(
    replica: ModelReplica, fake_serve: FakeServe
):
    assert forward(replica, fake_serve, infer_call("tree")).status == 200
    host: Host = replica.host
    expected = reference_run(TREE, {"X": X})[0]
    with host.acquire("tree") as lease:  # a run in flight on the model
        # The lane's measuring, after the load, holds a lease of its own until it settles.
        assert served_version(lease).lane_settled.wait(timeout=30)
        fake_serve.evict("tree")
        # Out of service for new requests, yet the leased session still runs.
        assert host.status("tree").versions[0].state is ModelState.UNLOADING
        np.testing.assert_allclose(lease.run({"X": X})["Y"], expected, rtol=1e-6)
        assert corral.runtime().stats().sessions_alive == 1
    # Closed once the last lease ended.
    assert host.status("tree").versions[0].state is ModelState.UNLOADED
    assert corral.runtime().stats().sessions_alive == 0
    # The next request loads it again and routes it here again.
    assert forward(replica, fake_serve, infer_call("tree")).status == 200
    assert host.status("tree").versions[0].state is ModelState.READY
    assert list(fake_serve.routed) == ["tree"]


def test_concurrent_requests_while_ray_evicts_routes_from_its_executor(
    replica: ModelReplica, fake_serve: FakeServe
):
    """Ray runs requests as tasks on the replica's loop and evicts from its default executor."""
    models = {"tree": TREE, "mlp": build_mlp(seed=1)}
    inputs = [np.full((1, 4), i / 10, dtype=np.float32) for i in range(120)]

    async def one(index: int) -> None:
        name = "tree" if index % 2 else "mlp"
        call = infer_call(name, inputs[index])
        # The model id is per request in Ray (a context variable); set per task here.
        fake_serve.model_id = name
        answer = await replica(call)
        assert answer.status == 200, (index, answer.body)
        output = orjson.loads(answer.body)["outputs"][0]
        expected = reference_run(models[name], {"X": inputs[index]})[0]
        got = np.array(output["data"], dtype=np.float32).reshape(output["shape"])
        np.testing.assert_allclose(got, expected, rtol=1e-5, err_msg=f"request {index}")

    async def evict_repeatedly(rounds: int) -> int:
        loop = asyncio.get_running_loop()
        evicted = 0
        for _ in range(rounds):
            for name in list(fake_serve.routed):
                entry = fake_serve.routed.pop(name)
                await loop.run_in_executor(None, entry.__del__)
                evicted += 1
            await asyncio.sleep(0)
        return evicted

    async def main() -> int:
        evictions = asyncio.create_task(evict_repeatedly(40))
        await asyncio.gather(*(one(i) for i in range(len(inputs))))
        return await evictions

    assert asyncio.run(main()) > 0
    assert replica.host.stats().unloads > 0


def test_stopping_a_replica_closes_its_host(replica: ModelReplica, fake_serve: FakeServe):
    assert forward(replica, fake_serve, infer_call("mlp")).status == 200
    replica.__del__()
    assert replica.host.state.value == "closed"
    replica.__del__()  # twice is harmless


# -- the ingress, with a handle that calls a replica directly ----------------------------------


class DirectHandle:
    """A deployment handle stand-in: records the model id, answers through ``answer``."""

    def __init__(self, answer: Callable[[HttpCall], Awaitable[HttpAnswer]]) -> None:
        self._answer = answer
        self.model_ids: list[str | None] = []
        self._model_id: str | None = None

    def options(self, *, multiplexed_model_id: str) -> DirectHandle:
        routed = DirectHandle(self._answer)
        routed.model_ids = self.model_ids
        routed._model_id = multiplexed_model_id
        return routed

    async def remote(self, call: HttpCall) -> HttpAnswer:
        self.model_ids.append(self._model_id)
        return await self._answer(call)


def http_request(method: str, path: str, body: bytes = b"", **headers: str) -> Request:
    """A Starlette request as Ray's proxy hands the ingress one."""
    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "query_string": b"",
        "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
    }
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return Request(scope, receive)


def ingress_request(
    ingress: V2Ingress, method: str, path: str, body: bytes = b"", **headers: str
) -> tuple[int, dict[str, str], bytes]:
    async def go() -> tuple[int, dict[str, str], bytes]:
        response = await ingress(http_request(method, path, body, **headers))
        return response.status_code, dict(response.headers), bytes(response.body)

    return asyncio.run(go())


def test_the_ingress_routes_models_and_forwards_the_rest(repo: Path):
    with Host(repo) as host:
        http_app = HttpApp(DataPlane(host))

        async def answer(call: HttpCall) -> HttpAnswer:
            return await call_asgi(http_app, call)

        handle = DirectHandle(answer)
        ingress = V2Ingress(handle, None, 1024)  # type: ignore[arg-type]
        body = infer_call("tree").body
        status, headers, content = ingress_request(ingress, "POST", "/v2/models/tree/infer", body)
        assert status == 200, content
        assert headers["content-type"] == "application/json"
        assert headers["content-length"] == str(len(content))
        assert ingress_request(ingress, "GET", "/v2/health/live")[0] == 200
        assert ingress_request(ingress, "GET", "/v2")[0] == 200
        assert handle.model_ids == ["tree", None, None]
        big = ingress_request(ingress, "POST", "/v2/models/tree/infer", b"x" * 2000)
        assert big[0] == 413
        declared = ingress_request(
            ingress, "POST", "/v2/models/tree/infer", b"{}", **{"content-length": "5000"}
        )
        assert declared[0] == 413
        assert handle.model_ids == ["tree", None, None]


class ReplicaSet:
    """A deployment handle over real replicas: routed calls go to the first, broadcasts to all."""

    def __init__(self, fake: FakeServe, replicas: list[ModelReplica]) -> None:
        self._fake = fake
        self.replicas = replicas
        self._model_id = ""

    def options(self, *, multiplexed_model_id: str) -> ReplicaSet:
        routed = ReplicaSet(self._fake, self.replicas)
        routed._model_id = multiplexed_model_id
        return routed

    async def remote(self, call: HttpCall, replica: int = 0) -> HttpAnswer:
        self._fake.model_id = self._model_id
        return await self.replicas[replica](call)

    def broadcast(self, method: str, call: HttpCall) -> SimpleNamespace:
        assert method == "__call__"

        async def results_async(timeout_s: float) -> list[HttpAnswer]:
            self._fake.model_id = ""
            return [await replica(call) for replica in self.replicas]

        return SimpleNamespace(results_async=results_async)


@pytest.fixture
def two_replicas(repo: Path, fake_serve: FakeServe) -> Iterator[ReplicaSet]:
    config = RayServeConfig(compute_workers=1)
    made = []
    for tag in ("replica-a", "replica-b"):
        fake_serve.tag = tag
        made.append(ModelReplica(str(repo), config))
    yield ReplicaSet(fake_serve, made)
    for replica in made:
        replica.__del__()


def test_the_process_views_are_every_replicas_made_one(two_replicas: ReplicaSet):
    """Issue 50, part 1: statistics, /metrics, the index and the status page of every replica."""
    from prometheus_client.parser import text_string_to_metric_families

    ingress = V2Ingress(two_replicas, None, 1 << 20)  # type: ignore[arg-type]

    async def scenario() -> dict[str, tuple[int, dict[str, str], bytes]]:
        # "tree" once on its own replica (a), twice on the other (a hot model's spread copy).
        for replica in (0, 1, 1):
            answer = await two_replicas.options(multiplexed_model_id="tree").remote(
                infer_call("tree"), replica
            )
            assert answer.status == 200, answer.body
        asked = {}
        for key, method, path in [
            ("stats", "GET", "/v2/models/tree/stats"),
            ("all", "GET", "/v2/models/stats"),
            ("metrics", "GET", "/metrics"),
            ("index", "POST", "/v2/repository/index"),
            ("status", "GET", "/v2/corral/status"),
            ("unknown", "GET", "/v2/models/nope/stats"),
        ]:
            response = await ingress(http_request(method, path))
            asked[key] = response.status_code, dict(response.headers), bytes(response.body)
        return asked

    asked = asyncio.run(scenario())
    status, _, body = asked["stats"]
    assert status == 200, body
    [row] = orjson.loads(body)["model_stats"]
    assert (row["name"], row["inference_count"]) == ("tree", 3)
    assert row["inference_stats"]["success"]["count"] == 3
    every = {row["name"]: row for row in orjson.loads(asked["all"][2])["model_stats"]}
    assert every["tree"]["inference_count"] == 3
    status, headers, body = asked["metrics"]
    assert status == 200
    assert headers["content-type"].startswith("text/plain")
    # Valid Prometheus text, each series named by its replica, the figures per replica.
    successes = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            assert sample.labels["replica"] in ("replica-a", "replica-b"), sample
            # The parser names a counter's samples with _total.
            if family.name == "nv_inference_request_success" and sample.labels["model"] == "tree":
                successes[sample.labels["replica"]] = sample.value
    assert successes == {"replica-a": 1, "replica-b": 2}
    index = {row["name"]: row for row in orjson.loads(asked["index"][2])}
    assert index["tree"]["state"] == "READY"
    assert set(index) == {"mlp", "tree"}
    document = orjson.loads(asked["status"][2])
    assert [entry["replica"] for entry in document["replicas"]] == ["replica-a", "replica-b"]
    status, _, body = asked["unknown"]
    assert status == 404
    assert b"replica-a" in body, body


def test_a_load_and_an_unload_reach_every_replica(two_replicas: ReplicaSet):
    ingress = V2Ingress(two_replicas, None, 1 << 20)  # type: ignore[arg-type]
    hosts = [replica.host for replica in two_replicas.replicas]

    def ask(path: str, body: bytes = b"") -> tuple[int, bytes]:
        status, _, content = ingress_request(ingress, "POST", path, body)
        return status, content

    assert ask("/v2/repository/models/mlp/load") == (200, b"")
    assert [host.status("mlp").state for host in hosts] == [ModelState.READY] * 2
    assert ask("/v2/repository/models/mlp/unload")[0] == 200
    assert [host.status("mlp").state for host in hosts] == [ModelState.UNLOADED] * 2
    # A load bringing its own config is refused by every replica, in the same words.
    config = orjson.dumps({"parameters": {"config": orjson.dumps({"max_batch_size": 4}).decode()}})
    status, content = ask("/v2/repository/models/mlp/load", config)
    assert status == 501, content
    assert b"a replica started later" in content
    assert b"0 of 2 replicas" in content
    assert [host.status("mlp").state for host in hosts] == [ModelState.UNLOADED] * 2
    status, content = ask("/v2/repository/models/nope/load")
    assert status == 404
    assert b"failed to load 'nope'" in content, content


def reply(replica: str, body: bytes, status: int = 200) -> Reply:
    return Reply.of(HttpAnswer(status, ((b"corral-replica", replica.encode()),), body))


def test_statistics_add_up_batch_size_by_batch_size():
    def row(last: int, sizes: dict[int, int]) -> dict[str, Any]:
        duration = {"count": 1, "ns": 10}
        kinds = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")
        return {
            "name": "m",
            "version": "1",
            "last_inference": last,
            "inference_count": 2,
            "execution_count": 1,
            "inference_stats": dict.fromkeys(kinds, duration),
            "batch_stats": [
                {"batch_size": size, "compute_infer": {"count": count, "ns": 5 * count}}
                for size, count in sizes.items()
            ],
        }

    answers = [
        reply("a", orjson.dumps({"model_stats": [row(7, {1: 2, 4: 1})]})),
        reply("b", orjson.dumps({"model_stats": [row(9, {4: 3, 8: 1})]})),
    ]
    [total] = orjson.loads(summed_statistics(answers).body)["model_stats"]
    assert (total["last_inference"], total["inference_count"], total["execution_count"]) == (
        9,
        4,
        2,
    )
    assert total["inference_stats"]["queue"] == {"count": 2, "ns": 20}
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in total["batch_stats"]] == [
        (1, 2),
        (4, 4),
        (8, 1),
    ]


def test_metrics_keep_one_header_per_family_and_label_every_series():
    page = b'# HELP up Up.\n# TYPE up gauge\nup 1\nup{zone="x"} 2.5\n'
    text = labelled_metrics([reply("a", page), reply("b", page)]).body.decode()
    assert text.splitlines() == [
        "# HELP up Up.",
        "# TYPE up gauge",
        'up{replica="a"} 1',
        'up{replica="a",zone="x"} 2.5',
        'up{replica="b"} 1',
        'up{replica="b",zone="x"} 2.5',
    ]
    with pytest.raises(FanoutError, match="replica a wrote a series before its # TYPE"):
        labelled_metrics([reply("a", b"up 1\n")])


def test_a_load_fails_as_a_replica_failed_naming_it_and_how_many_succeeded():
    answer = all_succeeded([reply("a", b""), reply("b", b'{"error":"no room"}', 507)])
    assert answer.status == 507
    assert orjson.loads(answer.body) == {"error": "no room (replica b; 1 of 2 replicas succeeded)"}
    with pytest.raises(FanoutError, match="does not name its replica"):
        Reply.of(HttpAnswer(200, (), b""))


def grpc_reply(replica: str, message: Any, code: grpc.StatusCode = grpc.StatusCode.OK) -> GrpcReply:
    body = b"" if message is None else message.SerializeToString()
    details = "" if code is grpc.StatusCode.OK else "no room"
    return GrpcReply.of(GrpcAnswer(code, details, body, (), (("corral-replica", replica),)))


def test_grpc_answers_of_every_replica_are_made_one_as_http_ones_are():
    def index(state: str) -> pb.RepositoryIndexResponse:
        return pb.RepositoryIndexResponse(
            models=[pb.RepositoryIndexResponse.ModelIndex(name="m", version="1", state=state)]
        )

    merged = grpc_merged_index(
        [grpc_reply("a", index("UNAVAILABLE")), grpc_reply("b", index("READY"))]
    )
    [row] = pb.RepositoryIndexResponse.FromString(merged.body).models
    assert row.state == "READY"

    def stats(last: int, sizes: dict[int, int]) -> pb.ModelStatisticsResponse:
        row = pb.ModelStatistics(name="m", version="1", last_inference=last, inference_count=2)
        row.inference_stats.success.count = 2
        for size, count in sizes.items():
            row.batch_stats.add(batch_size=size).compute_infer.count = count
        return pb.ModelStatisticsResponse(model_stats=[row])

    summed = grpc_summed_statistics(
        [grpc_reply("a", stats(3, {1: 1, 4: 2})), grpc_reply("b", stats(5, {4: 1}))]
    )
    [total] = pb.ModelStatisticsResponse.FromString(summed.body).model_stats
    assert (total.last_inference, total.inference_count) == (5, 4)
    assert total.inference_stats.success.count == 4
    assert [(b.batch_size, b.compute_infer.count) for b in total.batch_stats] == [(1, 1), (4, 3)]
    with pytest.raises(GrpcFailed) as failed:
        grpc_all_succeeded(
            [grpc_reply("a", None), grpc_reply("b", None, grpc.StatusCode.RESOURCE_EXHAUSTED)]
        )
    assert failed.value.answer.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert failed.value.answer.details == "no room (replica b; 1 of 2 replicas succeeded)"
    with pytest.raises(FanoutError, match="replica a answered what does not parse"):
        grpc_merged_index([GrpcReply("a", GrpcAnswer(grpc.StatusCode.OK, "", b"\xff\xff"))])


def test_the_grpc_ingress_answers_unavailable_when_the_replicas_cannot_be_made_one():
    class Unnamed(GrpcHandle):
        def broadcast(self, method: str, call: GrpcCall) -> SimpleNamespace:
            async def results_async(timeout_s: float) -> list[GrpcAnswer]:
                return [GrpcAnswer(grpc.StatusCode.OK, "", b"")]  # no corral-replica

            return SimpleNamespace(results_async=results_async)

    class Slow(GrpcHandle):
        def broadcast(self, method: str, call: GrpcCall) -> SimpleNamespace:
            async def results_async(timeout_s: float) -> list[GrpcAnswer]:
                raise TimeoutError("Timed out waiting for broadcast results.")

            return SimpleNamespace(results_async=results_async)

    async def never(call: GrpcCall, model_id: str | None) -> GrpcAnswer:
        raise AssertionError("routed, not asked of every replica")

    async def main() -> None:
        answers = []
        for handle in (Unnamed(never), Slow(never)):
            ingress = grpc_ingress(handle)
            try:
                async with grpc.aio.insecure_channel(await ingress.address()) as channel:
                    answers.append(await raw_call(channel, "RepositoryIndex", b""))
            finally:
                await ingress.stop()
        unnamed, slow = answers
        assert unnamed.code is grpc.StatusCode.UNAVAILABLE
        assert "does not name its replica" in unnamed.details
        assert slow.code is grpc.StatusCode.UNAVAILABLE
        assert "did not all answer in 600 s" in slow.details

    run_freeing_frames(main)


def test_what_cannot_be_made_one_is_named():
    # A replica's error is passed on with its status, naming the replica.
    with pytest.raises(FanoutError) as failed:
        every_status([reply("a", b"{}"), reply("b", b"gone away", 503)])
    passed = passed_answer(failed.value)
    assert passed is not None
    assert passed.status == 503
    assert orjson.loads(passed.body) == {"error": "gone away (replica b)"}
    assert passed_answer(FanoutError("other")) is None
    with pytest.raises(FanoutError, match="replica a answered list"):
        every_status([reply("a", b"[]")])
    with pytest.raises(FanoutError, match="no model replica is running"):
        merged_index([])
    with pytest.raises(FanoutError, match="no model replica is running"):
        grpc_merged_index([])
    # Comments and blank lines are part of no family.
    page = b"# a comment\n\n# HELP up Up.\n# TYPE up gauge\nup 1\n"
    assert labelled_metrics([reply("a", page)]).body == (
        b'# HELP up Up.\n# TYPE up gauge\nup{replica="a"} 1\n'
    )
    # The most advanced state wins, whichever replica answers first.
    rows = [{"name": "m", "version": "1", "state": "READY"}]
    later = [{"name": "m", "version": "1", "state": "UNAVAILABLE", "reason": "evicted"}]
    merged = merged_index([reply("a", orjson.dumps(rows)), reply("b", orjson.dumps(later))])
    assert orjson.loads(merged.body) == rows
    ok = GrpcAnswer(grpc.StatusCode.OK, "", b"", (), (("corral-replica", b"r1"),))
    assert GrpcReply.of(ok).replica == "r1"
    assert grpc_all_succeeded([GrpcReply.of(ok)]).code is grpc.StatusCode.OK
    ready = pb.RepositoryIndexResponse.ModelIndex(name="m", version="1", state="READY")
    gone = pb.RepositoryIndexResponse.ModelIndex(name="m", version="1", state="UNAVAILABLE")
    index = grpc_merged_index(
        [
            grpc_reply("a", pb.RepositoryIndexResponse(models=[ready])),
            grpc_reply("b", pb.RepositoryIndexResponse(models=[gone])),
        ]
    )
    assert [row.state for row in pb.RepositoryIndexResponse.FromString(index.body).models] == [
        "READY"
    ]

    async def answer(call: HttpCall) -> HttpAnswer:
        return HttpAnswer(200, ((b"corral-replica", b"r1"),), b"not json")

    class Broken(DirectHandle):
        def broadcast(self, method: str, call: HttpCall) -> SimpleNamespace:
            async def results_async(timeout_s: float) -> list[HttpAnswer]:
                return [await answer(call), HttpAnswer(200, ((b"corral-replica", b"r2"),), b"[]")]

            return SimpleNamespace(results_async=results_async)

    ingress = V2Ingress(Broken(answer), None, 1024)  # type: ignore[arg-type]
    status, _, content = ingress_request(ingress, "POST", "/v2/repository/index")
    assert status == 503
    assert b"replica r1 answered with no JSON" in content, content

    class Slow(DirectHandle):
        def broadcast(self, method: str, call: HttpCall) -> SimpleNamespace:
            async def results_async(timeout_s: float) -> list[HttpAnswer]:
                raise TimeoutError("Timed out waiting for broadcast results.")

            return SimpleNamespace(results_async=results_async)

    slow = V2Ingress(Slow(answer), None, 1024)  # type: ignore[arg-type]
    status, _, content = ingress_request(slow, "GET", "/metrics")
    assert status == 503
    assert b"did not all answer in 600 s" in content, content


def test_a_hot_models_requests_are_spread_over_every_replica_and_come_back():
    """Issue 50, part 2: past hot_model_in_flight, requests go without the model's id."""
    arrived = 0
    all_in = asyncio.Event()

    async def answer(call: HttpCall) -> HttpAnswer:
        nonlocal arrived
        arrived += 1
        if arrived == 3:
            all_in.set()
        await all_in.wait()
        return HttpAnswer(200, ((b"content-type", b"application/json"),), b"{}")

    async def scenario() -> tuple[list[int], list[str | None]]:
        handle = DirectHandle(answer)
        ingress = V2Ingress(handle, None, 1024, hot_model_in_flight=2)  # type: ignore[arg-type]
        body = infer_call("tree").body
        requests = [http_request("POST", "/v2/models/tree/infer", body) for _ in range(3)]
        responses = await asyncio.gather(*(ingress(request) for request in requests))
        # Metadata and the like stay with the model's own replicas, however hot it is.
        await ingress(http_request("GET", "/v2/models/tree"))
        return [response.status_code for response in responses], handle.model_ids

    statuses, model_ids = asyncio.run(scenario())
    assert statuses == [200, 200, 200]
    # Two in flight: the third goes to any replica (no id); the metadata by its id.
    assert model_ids == ["tree", "tree", None, "tree"]


class GatedHandle:
    """A handle whose first routed call waits for ``gate``; a call without an id gets 503."""

    def __init__(self, shared: SimpleNamespace, model_id: str | None = None) -> None:
        self.shared = shared
        self.model_id = model_id

    def options(self, *, multiplexed_model_id: str) -> GatedHandle:
        return GatedHandle(self.shared, multiplexed_model_id)

    async def remote(self, call: HttpCall) -> HttpAnswer:
        self.shared.model_ids.append(self.model_id)
        if self.model_id is None:  # the replica it was spread to has no room for the model
            return HttpAnswer(503, (), b'{"error": "no room"}')
        if not self.shared.first_in.is_set():
            self.shared.first_in.set()
            await self.shared.gate.wait()
        return HttpAnswer(200, ((b"content-type", b"application/json"),), b"{}")


def test_a_spread_request_a_replica_cannot_take_goes_to_the_models_own():
    async def scenario() -> tuple[int, list[str | None]]:
        shared = SimpleNamespace(model_ids=[], gate=asyncio.Event(), first_in=asyncio.Event())
        handle = GatedHandle(shared)
        ingress = V2Ingress(handle, None, 1024, hot_model_in_flight=1)  # type: ignore[arg-type]
        body = infer_call("tree").body
        first = asyncio.ensure_future(ingress(http_request("POST", "/v2/models/tree/infer", body)))
        await shared.first_in.wait()  # one in flight: the model is hot
        second = await ingress(http_request("POST", "/v2/models/tree/infer", body))
        shared.gate.set()
        assert (await first).status_code == 200
        return second.status_code, shared.model_ids

    status, model_ids = asyncio.run(scenario())
    assert status == 200  # refused where it was spread, answered by the model's own replica
    assert model_ids == ["tree", None, "tree"]


def test_the_ingress_checks_the_token_before_forwarding():
    async def never(call: HttpCall) -> HttpAnswer:
        raise AssertionError(f"forwarded {call.path} without a valid token")

    async def health(call: HttpCall) -> HttpAnswer:
        return HttpAnswer(200, (), b"{}")

    ingress = V2Ingress(DirectHandle(never), "s3cret", 1024)  # type: ignore[arg-type]
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "s3cret"}):
        status, response_headers, _ = ingress_request(ingress, "GET", "/v2/models/m", **headers)
        assert status == 401, headers
        assert response_headers["www-authenticate"] == "Bearer"
    open_ingress = V2Ingress(DirectHandle(health), "s3cret", 1024)  # type: ignore[arg-type]
    assert ingress_request(open_ingress, "GET", "/v2/health/ready")[0] == 200
    authorized = {"authorization": "Bearer s3cret"}
    assert ingress_request(open_ingress, "GET", "/v2/models/m", **authorized)[0] == 200


@pytest.mark.parametrize(
    ("error", "status"),
    [(BackPressureError(num_queued_requests=9, max_queued_requests=8), 429), (RayError(), 503)],
    ids=["back-pressure", "replica-gone"],
)
def test_ray_errors_become_statuses(error: Exception, status: int):
    async def fail(call: HttpCall) -> HttpAnswer:
        raise error

    ingress = V2Ingress(DirectHandle(fail), None, 1024)  # type: ignore[arg-type]
    answer = ingress_request(ingress, "POST", "/v2/models/m/infer", b"{}")
    assert answer[0] == status
    assert orjson.loads(answer[2])["error"]


# -- the command line, up to where Ray would start ----------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--max-models-per-replica", "0"], "max_models_per_replica must be a positive"),
        (["--replica-cpus", "-1"], "replica_cpus must be >= 0"),
    ],
    ids=["routing-count", "cpus"],
)
def test_ray_serve_refuses_bad_options_before_starting_ray(
    repo: Path,
    arguments: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
):
    from corral.cli import main

    # The command sets these for Ray; restore them after.
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    assert main(["ray-serve", str(repo), *arguments]) == 1
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(("budget", "message"), [("lots", "is not a size"), ("2G", "is ambiguous")])
def test_ray_serve_refuses_a_bad_budget_by_its_flag_before_starting_ray(
    repo: Path,
    budget: str,
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
):
    from corral.cli import main

    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    with pytest.raises(SystemExit) as exited:
        main(["ray-serve", str(repo), "--memory-budget", budget])
    assert exited.value.code == 2
    assert f"argument --memory-budget: size {budget!r} {message}" in capsys.readouterr().err


def test_ray_serve_refuses_a_repository_that_is_not_a_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
):
    from corral.cli import main

    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    assert main(["ray-serve", str(tmp_path / "missing")]) == 1
    assert "missing is not a folder" in capsys.readouterr().err


def test_ray_serve_refuses_cache_options_for_a_folder_before_starting_ray(
    repo: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
):
    from corral.cli import main

    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    assert main(["ray-serve", str(repo), "--cache-bytes", "1GiB"]) == 1
    assert "cache_bytes applies to a repository in object storage" in capsys.readouterr().err


def test_each_replica_claims_a_cache_folder_no_live_one_holds(tmp_path: Path):
    root = str(tmp_path / "cache")
    first, first_claim = replica_module.claim_cache_folder(root)
    second, second_claim = replica_module.claim_cache_folder(root)
    try:
        assert (first, second) == (f"{root}/replica-0", f"{root}/replica-1")
        os.close(first_claim)
        # Released (a replica stopped or died): the next replica takes it and its cache back.
        again, first_claim = replica_module.claim_cache_folder(root)
        assert again == first
    finally:
        os.close(first_claim)
        os.close(second_claim)


# -- serve_on_ray, with Ray and Serve stood in for -----------------------------------------------


class FakeCluster:
    """Records what serve_on_ray asks of ``ray`` and ``ray.serve``, in order."""

    def __init__(self, *, signal_during_init: bool = False, init_error: bool = False) -> None:
        self.calls: list[str] = []
        self._signal_during_init = signal_during_init
        self._init_error = init_error

    # ray
    def init(self, *, address: str, logging_level: int, **options: Any) -> None:
        self.calls.append(f"ray.init({address}, dashboard={options.get('include_dashboard')})")
        if self._init_error:
            raise ConnectionError(f"no Ray cluster at {address}")
        if self._signal_during_init:
            os.kill(os.getpid(), signal.SIGTERM)

    def shutdown(self) -> None:
        self.calls.append("ray.shutdown")


class FakeServeApi:
    def __init__(self, cluster: FakeCluster) -> None:
        self._calls = cluster.calls

    def start(self, *, http_options: dict[str, Any]) -> None:
        self._calls.append(f"serve.start({http_options['host']}:{http_options['port']})")

    def run(self, application: Any, *, name: str, route_prefix: str) -> SimpleNamespace:
        self._calls.append(f"serve.run({name}, {route_prefix})")
        # The ingress's handle: asked where its gRPC server listens.
        answer = SimpleNamespace(result=lambda timeout_s: "127.0.0.1:8001")
        return SimpleNamespace(grpc_address=SimpleNamespace(remote=lambda: answer))

    def shutdown(self) -> None:
        self._calls.append("serve.shutdown")

    def delete(self, name: str) -> None:
        self._calls.append(f"serve.delete({name})")


@pytest.fixture
def own_handlers() -> Iterator[Callable[..., None]]:
    """A SIGTERM/SIGINT handler of the test's, to check serve_on_ray puts it back."""

    def handler(signum: int, frame: Any) -> None:
        raise AssertionError(f"signal {signum} reached the test's own handler")

    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    for signum in saved:
        signal.signal(signum, handler)
    yield handler
    for signum, previous in saved.items():
        signal.signal(signum, previous)


def launch(
    monkeypatch: pytest.MonkeyPatch, repo: Path, cluster: FakeCluster, **options: Any
) -> tuple[int, list[str]]:
    import corral.ray._launch as launch_module

    monkeypatch.setattr(launch_module, "ray", cluster)
    monkeypatch.setattr(launch_module, "serve", FakeServeApi(cluster))
    urls: list[str] = []

    def started(url: str, grpc: str | None) -> None:
        urls.append(f"{url} {grpc}")
        os.kill(os.getpid(), signal.SIGTERM)  # what a stop from outside does

    code = launch_module.serve_on_ray(
        str(repo), RayServeConfig(), port=8123, started=started, **options
    )
    return code, urls


def test_serve_on_ray_starts_a_local_node_and_takes_it_down_on_sigterm(
    repo: Path, monkeypatch: pytest.MonkeyPatch, own_handlers: Callable[..., None]
):
    cluster = FakeCluster()
    code, urls = launch(monkeypatch, repo, cluster)
    assert code == 0
    assert urls == ["http://127.0.0.1:8123 127.0.0.1:8001"]
    assert cluster.calls == [
        "ray.init(local, dashboard=False)",
        "serve.start(127.0.0.1:8123)",
        "serve.run(corral, /)",
        "serve.shutdown",
        "ray.shutdown",
    ]
    assert signal.getsignal(signal.SIGTERM) is own_handlers
    assert signal.getsignal(signal.SIGINT) is own_handlers


def test_serve_on_ray_on_a_cluster_deletes_only_its_application(
    repo: Path, monkeypatch: pytest.MonkeyPatch, own_handlers: Callable[..., None]
):
    cluster = FakeCluster()
    code, _ = launch(monkeypatch, repo, cluster, address="auto")
    assert code == 0
    assert cluster.calls == [
        "ray.init(auto, dashboard=None)",
        "serve.start(127.0.0.1:8123)",
        "serve.run(corral, /)",
        "serve.delete(corral)",
        "ray.shutdown",
    ]
    assert signal.getsignal(signal.SIGTERM) is own_handlers


def test_a_signal_while_ray_starts_deploys_nothing_and_stops_ray(
    repo: Path, monkeypatch: pytest.MonkeyPatch, own_handlers: Callable[..., None]
):
    cluster = FakeCluster(signal_during_init=True)
    code, urls = launch(monkeypatch, repo, cluster)
    assert code == 0
    assert urls == []
    assert cluster.calls == ["ray.init(local, dashboard=False)", "serve.shutdown", "ray.shutdown"]
    assert signal.getsignal(signal.SIGTERM) is own_handlers


def test_a_failed_ray_init_is_raised_and_the_handlers_are_put_back(
    repo: Path, monkeypatch: pytest.MonkeyPatch, own_handlers: Callable[..., None]
):
    cluster = FakeCluster(init_error=True)
    with pytest.raises(ConnectionError, match="no Ray cluster at ray://nowhere:10001"):
        launch(monkeypatch, repo, cluster, address="ray://nowhere:10001")
    assert cluster.calls == ["ray.init(ray://nowhere:10001, dashboard=None)"]
    assert signal.getsignal(signal.SIGTERM) is own_handlers
    assert signal.getsignal(signal.SIGINT) is own_handlers


def test_ray_serve_has_a_flag_for_every_field_of_its_config():
    import argparse
    import dataclasses

    from corral.cli.commands import command_parser

    commands = next(
        action
        for action in command_parser("ray-serve")._actions
        if isinstance(action, argparse._SubParsersAction)
    )
    flags = {action.dest for action in commands.choices["ray-serve"]._actions}
    assert {f.name for f in dataclasses.fields(RayServeConfig)} <= flags


# -- gRPC: calls forwarded by the ingress's server, answered by corral's servicer --------------

SERVICE = "/inference.GRPCInferenceService"


def grpc_infer(name: str, x: np.ndarray = X) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=name)
    request.inputs.add(name="X", datatype="FP32", shape=x.shape)
    request.raw_input_contents.append(x.tobytes())
    return request


def output_of(answer: pb.ModelInferResponse) -> np.ndarray:
    [output] = answer.outputs
    return np.frombuffer(answer.raw_output_contents[0], np.float32).reshape(tuple(output.shape))


async def raw_call(channel: grpc.aio.Channel, method: str, body: bytes) -> GrpcAnswer:
    """A unary call of ``method`` with ``body`` as it is, over ``channel``; its outcome."""
    try:
        answer = await channel.unary_unary(f"{SERVICE}/{method}")(body, timeout=30)
    except grpc.aio.AioRpcError as exc:
        return GrpcAnswer(exc.code(), exc.details() or "", b"")
    return GrpcAnswer(grpc.StatusCode.OK, "", answer)


def test_call_handlers_answers_as_corrals_grpc_server_does(repo: Path):
    calls = [
        ("ModelInfer", grpc_infer("tree").SerializeToString()),
        ("ModelInfer", grpc_infer("nope").SerializeToString()),
        ("ModelInfer", b"\xff\xff\xff"),  # not a message: INVALID_ARGUMENT, not UNKNOWN
        ("ModelMetadata", pb.ModelMetadataRequest(name="mlp").SerializeToString()),
        ("ModelConfig", pb.ModelConfigRequest(name="../etc").SerializeToString()),
        ("ServerLive", b""),
        ("ModelStreamInfer", b""),  # corral serve does not serve it either
    ]

    async def main() -> None:
        host = Host(repo)
        try:
            plane = DataPlane(host)
            handlers = method_handlers(InferenceServicer(plane))
            server, port = await start_grpc_server(plane, "127.0.0.1", 0)
            try:
                async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                    for method, body in calls:
                        call = GrpcCall(f"{SERVICE}/{method}", body, (), None)
                        direct = await call_handlers(handlers, call)
                        over = await raw_call(channel, method, body)
                        assert (direct.code, direct.details) == (over.code, over.details), method
                        assert direct.body == over.body, method
                    infer = GrpcCall(
                        f"{SERVICE}/ModelInfer",
                        grpc_infer("tree").SerializeToString(),
                        ((REQUEST_ID_HEADER, "call-7"),),
                        30.0,
                    )
                    answered = await call_handlers(handlers, infer)
            finally:
                await server.stop(None)
        finally:
            await asyncio.to_thread(host.close)
        assert answered.initial_metadata == ((REQUEST_ID_HEADER, "call-7"),)
        response = pb.ModelInferResponse.FromString(answered.body)
        np.testing.assert_allclose(output_of(response), reference_run(TREE, {"X": X})[0])

    run_freeing_frames(main)


def test_a_replica_answers_a_grpc_call_routes_its_model_and_names_itself(
    replica: ModelReplica, fake_serve: FakeServe
):
    fake_serve.model_id = "tree"
    body = grpc_infer("tree").SerializeToString()
    answer = asyncio.run(replica.grpc(GrpcCall(f"{SERVICE}/ModelInfer", body, (), None)))
    assert answer.code is grpc.StatusCode.OK, answer.details
    assert answer.trailing_metadata == (("corral-replica", "replica-1"),)
    assert list(fake_serve.routed) == ["tree"]
    fake_serve.model_id = "nope"
    body = grpc_infer("nope").SerializeToString()
    missing = asyncio.run(replica.grpc(GrpcCall(f"{SERVICE}/ModelInfer", body, (), None)))
    assert missing.code is grpc.StatusCode.NOT_FOUND
    assert list(fake_serve.routed) == ["tree"]


class GrpcHandle:
    """A deployment handle stand-in for gRPC calls: records each call's method and model id."""

    def __init__(
        self,
        answer: Callable[[GrpcCall, str | None], Awaitable[GrpcAnswer]],
        routes: list[tuple[str, str | None]] | None = None,
        method: str = "__call__",
        model_id: str | None = None,
    ) -> None:
        self._answer = answer
        self.routes = [] if routes is None else routes
        self.calls: list[GrpcCall] = []
        self._method = method
        self._model_id = model_id

    def options(
        self, *, method_name: str | None = None, multiplexed_model_id: str | None = None
    ) -> GrpcHandle:
        """A handle with these options, keeping those it had (as Ray's does)."""
        routed = GrpcHandle(
            self._answer,
            self.routes,
            method_name or self._method,
            multiplexed_model_id or self._model_id,
        )
        routed.calls = self.calls
        return routed

    async def remote(self, call: GrpcCall) -> GrpcAnswer:
        self.routes.append((self._method, self._model_id))
        self.calls.append(call)
        return await self._answer(call, self._model_id)

    def broadcast(self, method: str, call: GrpcCall) -> SimpleNamespace:
        """Every replica asked: here one, named "r1"."""
        self.routes.append((f"broadcast:{method}", None))

        async def results_async(timeout_s: float) -> list[GrpcAnswer]:
            answer = await self._answer(call, None)
            return [dataclasses.replace(answer, trailing_metadata=(("corral-replica", "r1"),))]

        return SimpleNamespace(results_async=results_async)


def grpc_ingress(handle: GrpcHandle, auth_token: str | None = None, hot: int = 0) -> GrpcIngress:
    """An ingress's gRPC server on a free loopback port; made on the running loop."""
    return GrpcIngress(handle, GrpcListener(port=0), auth_token, 64 * 1024, HotModels(hot))  # type: ignore[arg-type]


def test_the_grpc_ingress_routes_models_and_refuses_what_ray_cannot_serve(repo: Path):
    expected = reference_run(TREE, {"X": X})[0]

    async def main() -> None:
        host = Host(repo)
        handlers = method_handlers(InferenceServicer(DataPlane(host)))

        async def answer(call: GrpcCall, model_id: str | None) -> GrpcAnswer:
            return await call_handlers(handlers, call)

        handle = GrpcHandle(answer)
        ingress = grpc_ingress(handle)
        try:
            address = await ingress.address()
            assert address.startswith("127.0.0.1:")
            async with grpc.aio.insecure_channel(address) as channel:
                stub = pb_grpc.GRPCInferenceServiceStub(channel)
                assert (await stub.ServerLive(pb.ServerLiveRequest(), timeout=30)).live
                inferred = await stub.ModelInfer(grpc_infer("tree"), timeout=30)
                np.testing.assert_allclose(output_of(inferred), expected, rtol=1e-6)
                meta = await stub.ModelMetadata(pb.ModelMetadataRequest(name="mlp"), timeout=30)
                assert meta.name == "mlp"
                stats = pb.ModelStatisticsRequest(name="tree")
                assert (await stub.ModelStatistics(stats, timeout=30)).model_stats
                # corral's own answer, through the ingress.
                missing = pb.ModelMetadataRequest(name="nope").SerializeToString()
                direct = await call_handlers(
                    handlers, GrpcCall(f"{SERVICE}/ModelMetadata", missing, (), None)
                )
                assert await raw_call(channel, "ModelMetadata", missing) == direct
                assert direct.code is grpc.StatusCode.NOT_FOUND
                # What is one process's view: every replica asked (issue 50, part 1).
                index = await stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=30)
                assert sorted(row.name for row in index.models) == ["mlp", "tree"]
                every = await stub.ModelStatistics(pb.ModelStatisticsRequest(), timeout=30)
                assert [row.name for row in every.model_stats if row.inference_count] == ["tree"]
                # A replica's failure is the call's: its code, the replica named.
                load = pb.RepositoryModelLoadRequest(model_name="nope").SerializeToString()
                failed = await raw_call(channel, "RepositoryModelLoad", load)
                assert failed.code is grpc.StatusCode.NOT_FOUND, failed
                assert failed.details.endswith("(replica r1; 0 of 1 replicas succeeded)")
                streaming = await raw_call(channel, "ModelStreamInfer", b"")
                assert streaming.code is grpc.StatusCode.UNIMPLEMENTED
                assert "does not serve ModelStreamInfer" in streaming.details
                large = grpc_infer("tree", np.zeros((1, 20_000), np.float32))
                with pytest.raises(grpc.aio.AioRpcError) as too_large:
                    await stub.ModelInfer(large, timeout=30)
                assert too_large.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        finally:
            await ingress.stop()
            await asyncio.to_thread(host.close)
        assert handle.routes == [
            ("grpc", None),
            ("grpc", "tree"),
            ("grpc", "mlp"),
            ("broadcast:grpc", None),
            ("grpc", "nope"),
            ("broadcast:grpc", None),
            ("broadcast:grpc", None),
            ("broadcast:grpc", None),
        ]

    run_freeing_frames(main)


def test_the_grpc_ingress_checks_the_token_and_does_not_pass_it_on():
    async def live(call: GrpcCall, model_id: str | None) -> GrpcAnswer:
        body = pb.ServerLiveResponse(live=True).SerializeToString()
        return GrpcAnswer(grpc.StatusCode.OK, "", body)

    async def main() -> None:
        handle = GrpcHandle(live)
        ingress = grpc_ingress(handle, auth_token="s3cret")
        try:
            async with grpc.aio.insecure_channel(await ingress.address()) as channel:
                stub = pb_grpc.GRPCInferenceServiceStub(channel)
                for metadata in ((), (("authorization", "Bearer wrong"),)):
                    with pytest.raises(grpc.aio.AioRpcError) as refused:
                        await stub.ServerMetadata(
                            pb.ServerMetadataRequest(), metadata=metadata, timeout=30
                        )
                    assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
                assert not handle.calls
                assert (await stub.ServerLive(pb.ServerLiveRequest(), timeout=30)).live
                token = (("authorization", "Bearer s3cret"), ("x-request-id", "r-1"))
                await stub.ServerLive(pb.ServerLiveRequest(), metadata=token, timeout=30)
        finally:
            await ingress.stop()
        assert len(handle.calls) == 2
        assert all(key != "authorization" for key, _ in handle.calls[1].metadata)
        assert ("x-request-id", "r-1") in handle.calls[1].metadata

    run_freeing_frames(main)


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (BackPressureError(num_queued_requests=9, max_queued_requests=8), "RESOURCE_EXHAUSTED"),
        (RayError(), "UNAVAILABLE"),
    ],
    ids=["back-pressure", "replica-gone"],
)
def test_ray_errors_become_grpc_codes(error: Exception, code: str):
    async def fail(call: GrpcCall, model_id: str | None) -> GrpcAnswer:
        raise error

    async def main() -> GrpcAnswer:
        ingress = grpc_ingress(GrpcHandle(fail))
        try:
            async with grpc.aio.insecure_channel(await ingress.address()) as channel:
                return await raw_call(channel, "ModelInfer", grpc_infer("m").SerializeToString())
        finally:
            await ingress.stop()

    answers: list[GrpcAnswer] = []

    async def keep() -> None:
        answers.append(await main())

    run_freeing_frames(keep)
    assert answers[0].code.name == code
    assert answers[0].details


def test_a_hot_models_grpc_calls_are_spread_and_one_refused_comes_back():
    """Past hot_model_in_flight, ModelInfer goes without the model's id; UNAVAILABLE returns."""

    async def main() -> list[tuple[str, str | None]]:
        own_in = 0
        all_in = asyncio.Event()
        body = pb.ModelInferResponse(model_name="tree").SerializeToString()

        async def answer(call: GrpcCall, model_id: str | None) -> GrpcAnswer:
            nonlocal own_in
            if model_id is None:  # the replica it was spread to has no room for the model
                return GrpcAnswer(grpc.StatusCode.UNAVAILABLE, "no room", b"")
            own_in += 1
            if own_in == 3:
                all_in.set()
            await all_in.wait()
            return GrpcAnswer(grpc.StatusCode.OK, "", body)

        handle = GrpcHandle(answer)
        ingress = grpc_ingress(handle, hot=2)
        try:
            async with grpc.aio.insecure_channel(await ingress.address()) as channel:
                stub = pb_grpc.GRPCInferenceServiceStub(channel)
                answers = await asyncio.gather(
                    *(stub.ModelInfer(grpc_infer("tree"), timeout=30) for _ in range(3))
                )
        finally:
            await ingress.stop()
        assert [answer.model_name for answer in answers] == ["tree"] * 3
        return handle.routes

    routes: list[list[tuple[str, str | None]]] = []

    async def keep() -> None:
        routes.append(await main())

    run_freeing_frames(keep)
    # Two in flight: the third went to any replica, was refused there, then to the model's own.
    assert routes[0] == [("grpc", "tree"), ("grpc", "tree"), ("grpc", None), ("grpc", "tree")]


def test_the_v2_ingress_serves_grpc_when_told_where(repo: Path):
    async def main() -> None:
        async def never(call: GrpcCall, model_id: str | None) -> GrpcAnswer:
            raise AssertionError("nothing is forwarded here")

        plain = V2Ingress(GrpcHandle(never), None, 1024)  # type: ignore[arg-type]
        assert await plain.grpc_address() is None
        plain.check_health()
        listener = GrpcListener(port=0, drain_timeout_s=1.0)
        ingress = V2Ingress(GrpcHandle(never), None, 1024, grpc=listener)  # type: ignore[arg-type]
        address = await ingress.grpc_address()
        assert address is not None
        ingress.check_health()
        host, port = address.rsplit(":", 1)
        assert host == "127.0.0.1"
        # Taken: another server may not bind it (no SO_REUSEPORT with one ingress replica).
        with pytest.raises(OSError, match=f"could not bind 127.0.0.1:{port}"):
            GrpcIngress(GrpcHandle(never), GrpcListener(port=int(port)), None, 1024, HotModels(0))  # type: ignore[arg-type]
        await ingress.__del__()  # what Ray awaits when it stops the replica
        await ingress.__del__()  # twice is harmless

    run_freeing_frames(main)


def test_the_grpc_listener_follows_the_config():
    assert grpc_listener(RayServeConfig(grpc_port=-1)) is None
    assert grpc_listener(RayServeConfig()) == GrpcListener("127.0.0.1", 8001, False, 10.0)
    shared = RayServeConfig(grpc_port=9001, grpc_host="0.0.0.0", ingress_replicas=2)
    assert grpc_listener(shared) == GrpcListener("0.0.0.0", 9001, True, 10.0)
    assert GrpcListener("::1", 9001).address == "[::1]:9001"


def test_call_handlers_gives_a_handler_what_grpc_aio_gives_it():
    """The context's calls a handler may make, and handlers call_handlers cannot answer."""
    seen: dict[str, Any] = {}

    async def unary(request: bytes, context: Any) -> bytes:
        seen["metadata"] = context.invocation_metadata()
        seen["peer"] = context.peer()
        seen["left"] = context.time_remaining()
        context.set_code(grpc.StatusCode.FAILED_PRECONDITION)
        context.set_details("not now")
        seen["code"], seen["details"] = context.code(), context.details()
        return request

    async def not_bytes(request: bytes, context: Any) -> Any:
        return 7

    async def streams(requests: Any, context: Any) -> None:
        return None  # a streaming handler that does not refuse

    class Handlers(grpc.GenericRpcHandler):
        def service(self, details: grpc.HandlerCallDetails) -> Any:
            return {
                "/t/Unary": grpc.unary_unary_rpc_method_handler(unary),
                "/t/NotBytes": grpc.unary_unary_rpc_method_handler(not_bytes),
                "/t/Streams": grpc.stream_stream_rpc_method_handler(streams),
                "/t/ServerStream": grpc.unary_stream_rpc_method_handler(streams),
            }.get(details.method)

    handlers = [Handlers()]

    async def main() -> None:
        call = GrpcCall("/t/Unary", b"x", (("k", "v"),), 30.0, "ipv4:127.0.0.1:5")
        answer = await call_handlers(handlers, call)
        assert (answer.code, answer.details, answer.body) == (
            grpc.StatusCode.FAILED_PRECONDITION,
            "not now",
            b"",
        )
        assert seen["metadata"] == (("k", "v"),)
        assert seen["peer"] == "ipv4:127.0.0.1:5"
        assert 0 < seen["left"] <= 30
        assert (seen["code"], seen["details"]) == (grpc.StatusCode.FAILED_PRECONDITION, "not now")
        missing = await call_handlers(handlers, GrpcCall("/t/Nope", b"", (), None))
        assert missing.code is grpc.StatusCode.UNIMPLEMENTED
        for method, words in [
            ("/t/NotBytes", "answered int, not serialized bytes"),
            ("/t/Streams", "a streaming handler that does not refuse"),
            ("/t/ServerStream", "only unary handlers are called here"),
        ]:
            with pytest.raises(TypeError, match=words):
                await call_handlers(handlers, GrpcCall(method, b"", (), None))

    asyncio.run(main())
