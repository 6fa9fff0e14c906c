"""The response cache of a real `corral serve --cache-config`, driven by tritonclient.

One server for the module, on the suite's edge (``CORRAL_EDGE``: the native edge's grouped
path, or the Python edge's), with ``--cache-config local,size=1048576`` and
``--system-shared-memory``. Its model ``m`` enables the cache in its config.pbtxt, as a
Triton repository does; ``plain`` does not. Each test sends inputs of its own, so that what
another test kept does not answer it; counts are compared before and after.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from corral.testing import build_mlp
from tests.helpers import add_model, reference_run
from tests.processes import ServerProcess, native_edge, start_server, stop_server
from tests.protocol.test_shared_memory import ShmObjects

pytestmark = [
    pytest.mark.timeout(120),
    # tritonclient's HTTP client is gevent-based: collected on another thread, it fails.
    pytest.mark.usefixtures("garbage_collected_on_the_main_thread"),
]

CONFIG = """
name: "m"
platform: "onnxruntime_onnx"
version_policy: { all { } }
response_cache { enable: true }
"""

CACHE_BYTES = 1 << 20


def rows(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((2, 4)).astype(np.float32)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("repository")
    add_model(root, "m", build_mlp(seed=1))
    add_model(root, "m", build_mlp(seed=2), version=2)
    (root / "m" / "config.pbtxt").write_text(CONFIG)
    add_model(root, "plain", build_mlp(seed=1))
    log = tmp_path_factory.mktemp("log") / "serve.log"
    served = start_server(
        root, log, "--cache-config", f"local,size={CACHE_BYTES}", "--system-shared-memory"
    )
    yield served
    stop_server(served)


@pytest.fixture
def http(server: ServerProcess) -> Iterator[Any]:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(server.http)
    yield client
    client.close()


@pytest.fixture
def grpc(server: ServerProcess) -> Iterator[Any]:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.grpc)
    yield client
    client.close()


def http_infer(client: Any, x: np.ndarray, model: str = "m", version: str = "") -> np.ndarray:
    import tritonclient.http as httpclient

    tensor = httpclient.InferInput("X", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=True)
    result = client.infer(model, [tensor], model_version=version)
    answer: np.ndarray = result.as_numpy("Y")
    return answer


def grpc_infer(client: Any, x: np.ndarray, version: str = "", **output: Any) -> Any:
    import tritonclient.grpc as grpcclient

    tensor = grpcclient.InferInput("X", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    wanted = [grpcclient.InferRequestedOutput("Y", **output)] if output else None
    return client.infer("m", [tensor], model_version=version, outputs=wanted)


def http_stats(client: Any, model: str = "m", version: str = "1") -> dict[str, Any]:
    (row,) = client.get_inference_statistics(model, version)["model_stats"]
    return {
        "executions": row["execution_count"],
        "inferences": row["inference_count"],
        "successes": row["inference_stats"]["success"]["count"],
        "hits": row["inference_stats"]["cache_hit"]["count"],
        "misses": row["inference_stats"]["cache_miss"]["count"],
    }


def expected(x: np.ndarray, seed: int = 1) -> np.ndarray:
    out: np.ndarray = reference_run(build_mlp(seed=seed), {"X": x})[0]
    return out


def test_a_repeated_request_is_answered_from_the_cache_over_http_and_grpc(http: Any, grpc: Any):
    x = rows(1)
    http_infer(http, x, version="1")  # loaded, so that the counts below are the cache's
    before = http_stats(http)
    first = http_infer(http, x, version="1")  # kept already: a hit
    x2 = rows(2)
    miss = http_infer(http, x2, version="1")
    by_grpc = grpc_infer(grpc, x2, version="1").as_numpy("Y")
    after = http_stats(http)
    np.testing.assert_allclose(first, expected(x), rtol=1e-6)
    np.testing.assert_array_equal(by_grpc, miss)  # the HTTP request's answer, kept
    # Three requests, one run: two answered from the cache, one miss kept.
    assert after["executions"] - before["executions"] == 1
    assert after["inferences"] - before["inferences"] == 1
    assert after["successes"] - before["successes"] == 3
    assert after["hits"] - before["hits"] == 2
    assert after["misses"] - before["misses"] == 1
    # gRPC's statistics carry the same fields.
    (row,) = grpc.get_inference_statistics("m", "1").model_stats
    assert row.inference_stats.cache_hit.count == after["hits"]
    assert row.inference_stats.cache_miss.count == after["misses"]
    assert row.inference_stats.cache_hit.ns > 0


def test_two_versions_never_share_an_answer(http: Any):
    x = rows(3)
    one = http_infer(http, x, version="1")
    two = http_infer(http, x, version="2")
    latest = http_infer(http, x)  # version 2, from its own answer
    np.testing.assert_allclose(one, expected(x, seed=1), rtol=1e-6)
    np.testing.assert_allclose(two, expected(x, seed=2), rtol=1e-6)
    np.testing.assert_array_equal(latest, two)
    assert http_stats(http, version="2")["hits"] >= 1


def test_a_model_without_the_cache_runs_every_request(http: Any):
    x = rows(4)
    http_infer(http, x, model="plain")
    before = http_stats(http, "plain")
    http_infer(http, x, model="plain")
    after = http_stats(http, "plain")
    assert after["executions"] - before["executions"] == 1
    assert (after["hits"], after["misses"]) == (0, 0)


def test_a_class_count_is_another_answer(grpc: Any):
    x = rows(5)
    grpc_infer(grpc, x)
    (row,) = grpc.get_inference_statistics("m", "2").model_stats
    result = grpc_infer(grpc, x, class_count=1)
    assert result.as_numpy("Y").dtype == np.object_  # classes, not the tensor kept
    (after,) = grpc.get_inference_statistics("m", "2").model_stats
    assert after.execution_count - row.execution_count == 1


def test_a_cached_answer_goes_to_the_requests_shared_memory(http: Any):
    import tritonclient.http as httpclient

    x = rows(6)
    wanted = expected(x, seed=2)
    http_infer(http, x)  # kept
    before = http_stats(http, version="2")
    objects = ShmObjects()
    try:
        handle, key = objects.create("cache_out", wanted.nbytes)
        http.register_system_shared_memory("cache_out", key, wanted.nbytes)
        tensor = httpclient.InferInput("X", [2, 4], "FP32")
        tensor.set_data_from_numpy(x, binary_data=True)
        out = httpclient.InferRequestedOutput("Y", binary_data=True)
        out.set_shared_memory("cache_out", wanted.nbytes)
        result = http.infer("m", [tensor], outputs=[out])
        # In shared memory, as Triton answers it: no data in the answer itself.
        assert set(result.get_output("Y")) == {"name", "datatype", "shape"}
        written = objects.shm.get_contents_as_numpy(handle, np.float32, list(wanted.shape))
        np.testing.assert_allclose(written, wanted, rtol=1e-6)
        http.unregister_system_shared_memory("cache_out")
    finally:
        objects.destroy_all()
    after = http_stats(http, version="2")
    assert after["executions"] == before["executions"]  # answered from the cache
    assert after["hits"] - before["hits"] == 1


def test_metrics_carry_tritons_cache_families(server: ServerProcess, http: Any):
    http_infer(http, rows(7), version="1")
    http_infer(http, rows(7), version="1")
    with urllib.request.urlopen(f"http://{server.http}/metrics", timeout=30) as response:
        text = response.read().decode()
    hits = http_stats(http)["hits"]
    assert f'nv_cache_num_hits_per_model{{model="m",version="1"}} {hits}\n' in text
    assert 'nv_cache_num_misses_per_model{model="m",version="1"} ' in text
    assert 'nv_cache_hit_duration_per_model{model="m",version="1"} ' in text
    assert 'nv_cache_miss_duration_per_model{model="m",version="1"} ' in text
    sizes = {
        sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "corral_response_cache_size_bytes"
        for sample in family.samples
    }
    assert sizes == {CACHE_BYTES}
    if native_edge():  # the native edge's grouped path took requests, and hit the cache
        native = {
            sample.labels["route"]: sample.value
            for family in text_string_to_metric_families(text)
            if family.name == "corral_edge_requests"
            for sample in family.samples
        }
        assert native["native"] > 0
    stats = json.loads(
        urllib.request.urlopen(f"http://{server.http}/v2/models/m/versions/1/stats", timeout=30)
        .read()
        .decode()
    )
    assert stats["model_stats"][0]["inference_stats"]["cache_hit"]["count"] == hits
