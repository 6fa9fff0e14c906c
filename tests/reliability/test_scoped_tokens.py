"""Scoped tokens on a real ``corral serve``, with Triton's own clients, on both edges.

One server per edge, each scope given its own tokens (or opened): inference takes either of
two tokens (on the native edge's own route too), model control and shared memory an admin
token, statistics a third, metadata is open and the health checks need nothing. Every scope
is tried with its tokens and with the others' (tritonclient over HTTP and gRPC, curl,
``corral status``), and no token appears in the server's log.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from grpc_health.v1 import health_pb2, health_pb2_grpc  # type: ignore[import-untyped]
from tritonclient.utils import InferenceServerException

from corral.protocol.proto import grpc_service_pb2 as pb
from corral.server.grpc.service import METHOD_SCOPES, OPEN_METHODS
from corral.server.http.routes import Endpoint
from corral.server.settings import ServerSettings
from corral.server.tokens import TokenPolicy, TokenScope
from corral.testing import build_mlp
from tests.helpers import add_model
from tests.processes import ServerProcess, start_server, stop_server

# tritonclient's HTTP client is gevent-based: collected on another thread, it fails there.
pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.usefixtures("garbage_collected_on_the_main_thread"),
]

INFER_A, INFER_B, ADMIN, STATS = "infer-4f1c", "infer-9e2d", "admin-77aa", "stats-5b0e"
EVERY_TOKEN = (INFER_A, INFER_B, ADMIN, STATS)
X = np.random.default_rng(7).standard_normal((2, 4)).astype(np.float32)


def bearer(token: str | None) -> dict[str, str]:
    return {} if token is None else {"authorization": f"Bearer {token}"}


NATIVE = pytest.param(
    "native",
    marks=pytest.mark.skipif(
        importlib.util.find_spec("corral_edge") is None, reason="corral_edge is not built"
    ),
)


@pytest.fixture(scope="module", params=[NATIVE, "python"])
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp(f"scoped-{request.param}")
    repo = root / "models"
    add_model(repo, "mlp", build_mlp(4, 8, 3))
    add_model(repo, "spare", build_mlp(4, 8, 3))
    server = start_server(
        repo,
        root / "serve.log",
        "--model-control-tokens",
        ADMIN,
        "--shared-memory-tokens",
        ADMIN,
        "--statistics-tokens",
        STATS,
        "--metadata-tokens",
        "open",
        "--system-shared-memory",
        # From the environment, as a deployment would keep it off the command line; it is
        # the default the scopes above override.
        environment={
            "CORRAL_EDGE": request.param,
            "CORRAL_INFERENCE_TOKENS": f"{INFER_A},{INFER_B}",
            "CORRAL_AUTH_TOKEN": "fallback-never-used",
        },
    )
    try:
        yield server
    finally:
        stop_server(server)


def http_infer(client: httpclient.InferenceServerClient, token: str | None) -> np.ndarray:
    given = httpclient.InferInput("X", [2, 4], "FP32")
    given.set_data_from_numpy(X, binary_data=False)
    answer = client.infer("mlp", [given], headers=bearer(token))
    result: np.ndarray = answer.as_numpy("Y")
    return result


def grpc_infer(client: grpcclient.InferenceServerClient, token: str | None) -> np.ndarray:
    given = grpcclient.InferInput("X", [2, 4], "FP32")
    given.set_data_from_numpy(X)
    answer = client.infer("mlp", [given], headers=bearer(token))
    result: np.ndarray = answer.as_numpy("Y")
    return result


def refused(call: object, scope: str) -> None:
    """``call()`` is refused for want of a token of ``scope``, the refusal naming it."""
    with pytest.raises(InferenceServerException) as refusal:
        call()  # type: ignore[operator]
    text = str(refusal.value)
    assert f"{scope} scope" in text, text
    assert "401" in text or "UNAUTHENTICATED" in text, text
    for token in EVERY_TOKEN:
        assert token not in text


def native_answered(server: ServerProcess) -> float:
    with urllib.request.urlopen(
        urllib.request.Request(f"http://{server.http}/metrics", headers=bearer(STATS)), timeout=30
    ) as answer:
        found = re.search(
            r'^corral_edge_requests_total\{route="native"\} (\S+)$', answer.read().decode(), re.M
        )
    return float(found[1]) if found else 0.0


def test_inference_takes_either_of_its_tokens_and_no_other(served: ServerProcess):
    http = httpclient.InferenceServerClient(served.http)
    rpc = grpcclient.InferenceServerClient(served.grpc)
    try:
        before = native_answered(served)
        expected = http_infer(http, INFER_A)
        for token in (INFER_A, INFER_B):
            np.testing.assert_array_equal(http_infer(http, token), expected)
            np.testing.assert_array_equal(grpc_infer(rpc, token), expected)
        if "(the native edge)" in served.log.read_text():
            # Both tokens are taken on the native edge's own route, not forwarded: the first
            # request and the four above.
            assert native_answered(served) - before >= 5
        for token in (None, ADMIN, STATS, "fallback-never-used"):
            refused(lambda token=token: http_infer(http, token), "inference")
            refused(lambda token=token: grpc_infer(rpc, token), "inference")
    finally:
        http.close()
        rpc.close()


def test_model_control_and_shared_memory_take_the_admin_token(served: ServerProcess):
    http = httpclient.InferenceServerClient(served.http)
    rpc = grpcclient.InferenceServerClient(served.grpc)
    try:
        for token in (None, INFER_A, STATS):
            refused(
                lambda token=token: http.load_model("spare", headers=bearer(token)), "model_control"
            )
            refused(
                lambda token=token: rpc.unload_model("spare", headers=bearer(token)),
                "model_control",
            )
            refused(
                lambda token=token: http.get_system_shared_memory_status(headers=bearer(token)),
                "shared_memory",
            )
            refused(
                lambda token=token: rpc.get_system_shared_memory_status(headers=bearer(token)),
                "shared_memory",
            )
        http.load_model("spare", headers=bearer(ADMIN))
        assert http.is_model_ready("spare")  # metadata is open: no token
        rpc.unload_model("spare", headers=bearer(ADMIN))
        index = rpc.get_model_repository_index(headers=bearer(ADMIN))
        assert {model.name for model in index.models} == {"mlp", "spare"}
        assert http.get_system_shared_memory_status(headers=bearer(ADMIN)) == []
        assert not rpc.get_system_shared_memory_status(headers=bearer(ADMIN)).regions
    finally:
        http.close()
        rpc.close()


def test_metadata_is_open_and_health_needs_nothing(served: ServerProcess):
    http = httpclient.InferenceServerClient(served.http)
    rpc = grpcclient.InferenceServerClient(served.grpc)
    try:
        assert http.is_server_live()
        assert rpc.is_server_ready()
        assert http.get_server_metadata()["name"] == "corral"
        assert rpc.get_model_metadata("mlp").name == "mlp"
        assert http.get_model_config("mlp")["name"] == "mlp"
        channel = grpc.insecure_channel(served.grpc)
        health = health_pb2_grpc.HealthStub(channel)
        assert health.Check(health_pb2.HealthCheckRequest(service="mlp"), timeout=30).status == 1
        channel.close()
    finally:
        http.close()
        rpc.close()


def test_statistics_metrics_and_the_status_page_take_their_token(served: ServerProcess):
    http = httpclient.InferenceServerClient(served.http)
    rpc = grpcclient.InferenceServerClient(served.grpc)
    try:
        for token in (None, INFER_A, ADMIN):
            refused(
                lambda token=token: http.get_inference_statistics(headers=bearer(token)),
                "statistics",
            )
            refused(
                lambda token=token: rpc.get_inference_statistics(headers=bearer(token)),
                "statistics",
            )
        assert http.get_inference_statistics("mlp", headers=bearer(STATS))["model_stats"]
        assert rpc.get_inference_statistics("mlp", headers=bearer(STATS)).model_stats
    finally:
        http.close()
        rpc.close()
    curl = ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "30"]
    metrics = f"http://{served.http}/metrics"
    assert (
        subprocess.run([*curl, metrics], capture_output=True, text=True, timeout=60).stdout == "401"
    )
    with_token = [*curl, "-H", f"Authorization: Bearer {STATS}", metrics]
    assert subprocess.run(with_token, capture_output=True, text=True, timeout=60).stdout == "200"
    status = [sys.executable, "-m", "corral.cli", "status", f"http://{served.http}", "--json"]
    environment = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    shown = subprocess.run(
        status,
        capture_output=True,
        text=True,
        timeout=60,
        env={**environment, "CORRAL_STATUS_TOKEN": STATS},
    )
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["server"]["name"] == "corral"
    wrong = subprocess.run(
        [*status, "--token", INFER_A], capture_output=True, text=True, timeout=60, env=environment
    )
    assert wrong.returncode != 0
    assert "refused the token" in wrong.stderr, wrong.stderr


def test_no_token_is_in_the_log(served: ServerProcess):
    log = served.log.read_text()
    assert "tokens on inference, model_control, shared_memory, statistics" in log, log[:2000]
    for token in (*EVERY_TOKEN, "fallback-never-used"):
        assert token not in log


# -- the tables ---------------------------------------------------------------------------------


def test_every_http_endpoint_has_its_scope():
    expected = {
        TokenScope.INFERENCE: {Endpoint.INFER},
        TokenScope.METADATA: {
            Endpoint.SERVER_METADATA,
            Endpoint.MODEL_METADATA,
            Endpoint.MODEL_READY,
            Endpoint.MODEL_CONFIG,
        },
        TokenScope.MODEL_CONTROL: {Endpoint.REPOSITORY_INDEX, Endpoint.LOAD, Endpoint.UNLOAD},
        TokenScope.SHARED_MEMORY: {
            Endpoint.MEMORY_STATUS,
            Endpoint.MEMORY_REGISTER,
            Endpoint.MEMORY_UNREGISTER,
        },
        TokenScope.STATISTICS: {
            Endpoint.MODEL_STATS,
            Endpoint.ALL_STATS,
            Endpoint.STATUS,
            Endpoint.MODEL_STATUS,
            Endpoint.METRICS,
        },
    }
    for scope, endpoints in expected.items():
        assert {e for e in Endpoint if e.scope is scope} == endpoints, scope
    assert {e for e in Endpoint if e.scope is None} == {Endpoint.LIVE, Endpoint.READY}


def test_every_grpc_method_is_open_or_in_a_scope():
    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    methods = {f"/{service.full_name}/{method.name}" for method in service.methods}
    unplaced = methods - set(METHOD_SCOPES) - set(OPEN_METHODS)
    assert not unplaced


def test_the_policy_from_settings():
    settings = ServerSettings(
        repository=Path("models"),
        auth_token="everything",
        inference_tokens="a,b",
        metadata_tokens="open",
    )
    policy = settings.token_policy()
    assert policy.accepted(TokenScope.INFERENCE) == (b"Bearer a", b"Bearer b")
    assert policy.accepted(TokenScope.METADATA) is None
    assert policy.accepted(TokenScope.STATISTICS) == (b"Bearer everything",)
    assert policy.allows(TokenScope.INFERENCE, [b"Bearer b"])
    assert not policy.allows(TokenScope.INFERENCE, [b"Bearer everything"])
    assert policy.allows_some([])  # metadata is open: a 404 may be told
    closed = TokenPolicy.build("t", {})
    assert not closed.allows_some([b"Bearer x"])
    assert closed.allows_some([b"Bearer t"])
    assert closed.describe() == "tokens on"
    assert TokenPolicy.open().describe() == ""
    for text in ("", "a,,b", " , ", "a b"):
        with pytest.raises(ValueError, match="inference_tokens"):
            ServerSettings(repository=Path("models"), inference_tokens=text)
