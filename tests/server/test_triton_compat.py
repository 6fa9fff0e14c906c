"""Triton's clients against a real ``corral serve``: readiness, error texts, compression.

The calls are those Triton's Python client examples make (readiness before sending, the
messages they match on, ``request_compression_algorithm``/``response_compression_algorithm``),
plus raw HTTP requests for what tritonclient cannot send (other codings, a compression bomb).
"""

from __future__ import annotations

import gzip
import http.client
import json
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from corral.testing import build_mlp, build_tree
from tests.helpers import add_model, reference_run, wait_until
from tests.processes import ServerProcess, start_server, stop_server

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.usefixtures("garbage_collected_on_the_main_thread"),
]

X = np.random.default_rng(16).standard_normal((3, 4)).astype(np.float32)
#: The server's --max-request-bytes: the bomb inflates past it.
LIMIT = 1024 * 1024


@pytest.fixture(scope="module")
def triton_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repository")
    for name, model in [
        ("mlp", build_mlp(seed=1)),
        ("tree", build_tree(seed=2)),
        ("ready_http", build_mlp(seed=3)),
        ("ready_grpc", build_mlp(seed=4)),
        ("unloaded", build_mlp(seed=5)),
    ]:
        add_model(root, name, model)
    add_model(root, "broken", b"not a model")
    return root


@pytest.fixture(scope="module")
def server(triton_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("log") / "serve.log"
    served = start_server(triton_repo, log, "--max-request-bytes", str(LIMIT))
    yield served
    stop_server(served)


@pytest.fixture
def http_client(server: ServerProcess) -> Iterator[Any]:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(server.http)
    yield client
    client.close()


@pytest.fixture
def grpc_client(server: ServerProcess) -> Iterator[Any]:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.grpc)
    yield client
    client.close()


def raw(
    server: ServerProcess, method: str, path: str, body: bytes = b"", **headers: str
) -> tuple[int, dict[str, str], bytes]:
    host, port = server.http.split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def infer_json(x: np.ndarray = X) -> bytes:
    tensor = {"name": "X", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}
    return json.dumps({"inputs": [tensor]}).encode()


def expected_mlp(x: np.ndarray = X) -> np.ndarray:
    return reference_run(build_mlp(seed=1), {"X": x})[0]


# -- readiness loads the model ---------------------------------------------------------------


def test_readiness_loads_a_model_before_its_first_request_over_http(http_client: Any):
    index = {row["name"]: row for row in http_client.get_model_repository_index()}
    assert index["ready_http"]["state"] == "UNAVAILABLE"  # not loaded yet
    assert http_client.is_model_ready("ready_http")
    assert http_client.is_model_ready("ready_http", "1")
    index = {row["name"]: row for row in http_client.get_model_repository_index()}
    assert index["ready_http"]["state"] == "READY"
    assert not http_client.is_model_ready("nope")


def test_readiness_loads_a_model_before_its_first_request_over_grpc(grpc_client: Any):
    assert grpc_client.is_model_ready("ready_grpc")
    states = {m.name: m.state for m in grpc_client.get_model_repository_index().models}
    assert states["ready_grpc"] == "READY"


def test_a_failed_model_is_not_ready_and_the_index_says_why(http_client: Any, grpc_client: Any):
    assert not http_client.is_model_ready("broken")
    assert not grpc_client.is_model_ready("broken")
    (row,) = [r for r in http_client.get_model_repository_index() if r["name"] == "broken"]
    assert row["state"] == "UNAVAILABLE"
    assert "could not load" in row["reason"]


def test_a_model_unloaded_through_the_protocol_stays_not_ready(http_client: Any):
    # Triton's model-control example: load, ready; unload, not ready.
    http_client.load_model("unloaded")
    assert http_client.is_model_ready("unloaded")
    http_client.unload_model("unloaded")
    assert not http_client.is_model_ready("unloaded")
    assert not http_client.is_model_ready("unloaded")  # and asking did not load it
    http_client.load_model("unloaded")
    assert http_client.is_model_ready("unloaded")


# -- Triton's error texts --------------------------------------------------------------------


def test_unknown_models_and_versions_get_tritons_text_over_http(http_client: Any):
    from tritonclient.http import InferInput
    from tritonclient.utils import InferenceServerException

    tensor = InferInput("X", [3, 4], "FP32")
    tensor.set_data_from_numpy(X)
    with pytest.raises(InferenceServerException) as unknown:
        http_client.infer("wrong_model_name", [tensor])
    assert unknown.value.message().startswith(
        "Request for unknown model: 'wrong_model_name' is not found"
    )
    with pytest.raises(InferenceServerException) as metadata:
        http_client.get_model_metadata("wrong_model_name")
    assert "Request for unknown model" in metadata.value.message()
    with pytest.raises(InferenceServerException) as version:
        http_client.infer("mlp", [tensor], model_version="9")
    assert version.value.message().startswith(
        "Request for unknown model: 'mlp' version 9 is not found"
    )
    with pytest.raises(InferenceServerException) as load:
        http_client.load_model("wrong_model_name")
    assert "failed to load 'wrong_model_name'" in load.value.message()


def test_unknown_models_and_load_failures_get_tritons_text_over_grpc(grpc_client: Any):
    from tritonclient.grpc import InferInput
    from tritonclient.utils import InferenceServerException

    tensor = InferInput("X", [3, 4], "FP32")
    tensor.set_data_from_numpy(X)
    with pytest.raises(InferenceServerException) as unknown:
        grpc_client.infer("wrong_model_name", [tensor])
    assert unknown.value.message().startswith("Request for unknown model")
    assert unknown.value.status() == "StatusCode.NOT_FOUND"
    with pytest.raises(InferenceServerException) as config:
        grpc_client.get_model_config("wrong_model_name")
    assert "Request for unknown model" in config.value.message()
    with pytest.raises(InferenceServerException) as load:
        grpc_client.load_model("broken")
    assert load.value.message().startswith("failed to load 'broken': ")
    # Not ONNX: fails alike until its file changes (Triton: INVALID_ARGUMENT; docs/server.md).
    assert load.value.status() == "StatusCode.FAILED_PRECONDITION"


# -- compression -----------------------------------------------------------------------------


@pytest.mark.parametrize("request_coding", ["gzip", "deflate", None])
@pytest.mark.parametrize("response_coding", ["gzip", "deflate", None])
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_tritonclient_compressed_requests_and_answers(
    http_client: Any, request_coding: str | None, response_coding: str | None, binary: bool
):
    from tritonclient.http import InferInput, InferRequestedOutput

    tensor = InferInput("X", [3, 4], "FP32")
    tensor.set_data_from_numpy(X, binary_data=binary)
    result = http_client.infer(
        "mlp",
        [tensor],
        outputs=[InferRequestedOutput("Y", binary_data=binary)],
        request_compression_algorithm=request_coding,
        response_compression_algorithm=response_coding,
    )
    np.testing.assert_allclose(result.as_numpy("Y"), expected_mlp(), rtol=1e-6)


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_answers_are_compressed_as_asked(server: ServerProcess, coding: str):
    inflate = gzip.decompress if coding == "gzip" else zlib.decompress
    status, headers, body = raw(
        server,
        "POST",
        "/v2/models/mlp/infer",
        infer_json(),
        **{"Accept-Encoding": f"br;q=1, {coding};q=0.5", "Content-Type": "application/json"},
    )
    assert (status, headers["content-encoding"]) == (200, coding)
    (output,) = json.loads(inflate(body))["outputs"]
    np.testing.assert_allclose(output["data"], expected_mlp().ravel(), rtol=1e-6)
    status, headers, body = raw(
        server, "POST", "/v2/models/mlp/infer", infer_json(), **{"Accept-Encoding": "gzip;q=0"}
    )
    assert status == 200
    assert "content-encoding" not in headers
    assert json.loads(body)["outputs"][0]["name"] == "Y"


def test_a_compressed_body_that_inflates_past_the_limit_is_refused_413(server: ServerProcess):
    bomb = gzip.compress(b" " * (64 * LIMIT))  # 64 MiB of spaces in about 64 KiB
    assert len(bomb) < LIMIT // 8
    status, _, body = raw(
        server, "POST", "/v2/models/mlp/infer", bomb, **{"Content-Encoding": "gzip"}
    )
    assert status == 413
    assert f"inflates from gzip to more than {LIMIT} bytes" in json.loads(body)["error"]
    # The server is still serving, and a compressed body within the limit is read.
    status, _, body = raw(
        server,
        "POST",
        "/v2/models/mlp/infer",
        zlib.compress(infer_json()),
        **{"Content-Encoding": "deflate"},
    )
    assert status == 200, body


def test_a_gzip_body_of_several_members_is_read_whole_and_still_cut_at_the_limit(
    server: ServerProcess,
):
    # RFC 1952: a gzip body is a series of members, as pigz and some proxies send it.
    body = infer_json()
    members = b"".join(gzip.compress(body[at : at + 50]) for at in range(0, len(body), 50))
    assert len(members) > len(gzip.compress(body))  # several members, not one
    status, _, answer = raw(
        server, "POST", "/v2/models/mlp/infer", members, **{"Content-Encoding": "gzip"}
    )
    assert status == 200, answer
    (output,) = json.loads(answer)["outputs"]
    np.testing.assert_allclose(output["data"], expected_mlp().ravel(), rtol=1e-6)
    # Members that each inflate within the limit, and together past it: refused 413.
    piece = gzip.compress(b" " * (LIMIT // 4))
    status, _, answer = raw(
        server, "POST", "/v2/models/mlp/infer", piece * 5, **{"Content-Encoding": "gzip"}
    )
    assert status == 413
    assert f"inflates from gzip to more than {LIMIT} bytes" in json.loads(answer)["error"]
    # A member cut short after a whole one is still cut short.
    status, _, answer = raw(
        server,
        "POST",
        "/v2/models/mlp/infer",
        gzip.compress(body) + gzip.compress(b" ")[:-4],
        **{"Content-Encoding": "gzip"},
    )
    assert status == 400
    assert "cut short" in json.loads(answer)["error"]


@pytest.mark.parametrize(
    ("headers", "body", "status", "named"),
    [
        ({"Content-Encoding": "br"}, b"\x0b\x02\x80{}\x03", 415, "Content-Encoding 'br'"),
        ({"Content-Encoding": "gzip, gzip"}, b"", 415, "Content-Encoding 'gzip, gzip'"),
        ({"Content-Encoding": "gzip"}, b"{}", 400, "not valid gzip data"),
        ({"Content-Encoding": "gzip"}, gzip.compress(b"{}")[:-4], 400, "cut short"),
        ({"Content-Encoding": "deflate"}, gzip.compress(b"{}"), 400, "not valid deflate"),
    ],
    ids=["brotli", "stacked", "not-gzip", "cut-short", "gzip-as-deflate"],
)
def test_bodies_that_cannot_be_inflated_are_refused_by_name(
    server: ServerProcess, headers: dict[str, str], body: bytes, status: int, named: str
):
    answered, _, text = raw(server, "POST", "/v2/models/mlp/infer", body, **headers)
    assert answered == status
    assert named in json.loads(text)["error"]


def test_control_plane_bodies_are_inflated_too(server: ServerProcess):
    status, _, body = raw(
        server,
        "POST",
        "/v2/repository/index",
        gzip.compress(b'{"ready": true}'),
        **{"Content-Encoding": "gzip"},
    )
    assert status == 200
    assert all(row["state"] == "READY" for row in json.loads(body))
    status, _, _ = raw(
        server, "POST", "/v2/repository/index", b"{}", **{"Content-Encoding": "compress"}
    )
    assert status == 415


def test_inflated_bytes_are_held_in_the_body_budget_as_they_come():
    from corral.server.bodies import BodyBudget, BodyBudgetExceeded
    from corral.server.http.compression import INFLATE_PIECE_BYTES, inflate

    body = gzip.compress(b"x" * (3 * INFLATE_PIECE_BYTES))
    budget = BodyBudget(4 * INFLATE_PIECE_BYTES)
    with budget.reserve(len(body)) as held:
        assert len(inflate(body, "gzip", 4 * INFLATE_PIECE_BYTES, held)) == 3 * INFLATE_PIECE_BYTES
        assert budget.held == 3 * INFLATE_PIECE_BYTES  # the inflated size, not the sent one
    assert budget.held == 0
    small = BodyBudget(2 * INFLATE_PIECE_BYTES)
    with small.reserve(len(body)) as held, pytest.raises(BodyBudgetExceeded):
        inflate(body, "gzip", 4 * INFLATE_PIECE_BYTES, held)  # refused at the third piece
    assert small.held == 0


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([], None),
        ([b"identity"], None),
        ([b" Identity ", b""], None),  # no coding, however spelled
        ([b"identity", b"GZIP"], "gzip"),
        ([b"deflate"], "deflate"),
    ],
)
def test_identity_is_no_coding_at_all(values: list[bytes], expected: str | None):
    from corral.server.http.compression import request_encoding

    headers = [(b"host", b"x")] + [(b"content-encoding", value) for value in values]
    assert request_encoding(headers) == expected


def test_bytes_after_the_compressed_stream_are_refused_by_count():
    from corral.server.http.compression import EncodingRefused, inflate

    with pytest.raises(EncodingRefused) as caught:
        inflate(gzip.compress(b"{}") + b"tail", "gzip", 1024, None)
    assert caught.value.status == 400
    assert "has 4 bytes after its gzip data" in str(caught.value)


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        ("gzip;q=0, deflate", "deflate"),
        ("gzip;q=0.0", None),
        ("br, gzip;q=0.5", "gzip"),
        ("gzip;q=high", "gzip"),  # a malformed weight is no weight
        ("deflate; level=9 ;q=1", "deflate"),
        ("identity", None),
    ],
)
def test_the_answer_takes_the_first_coding_accept_encoding_allows(
    accept: str, expected: str | None
):
    from corral.server.http.compression import response_encoding

    assert response_encoding([(b"accept-encoding", accept.encode())]) == expected


# -- Triton's command line -------------------------------------------------------------------


def test_explicit_model_control_serves_only_the_models_loaded(triton_repo: Path, tmp_path: Path):
    import tritonclient.http as httpclient
    from tritonclient.http import InferInput
    from tritonclient.utils import InferenceServerException

    served = start_server(
        triton_repo,
        tmp_path / "explicit.log",
        "--model-control-mode",
        "explicit",
        "--load-model",
        "mlp",
        "--exit-timeout-secs",
        "10",
    )
    client = httpclient.InferenceServerClient(served.http)
    try:
        wait_until(client.is_server_ready, timeout=60)
        # What the server made before serving, then the model, kept out of later collections:
        # the second just after readiness, on the event loop once the loading task returns.
        wait_until(lambda: "--load-model's models are loaded: " in served.log.read_text(), 60)
        log = served.log.read_text()
        assert "--load-model: 1 of 1 done: mlp loaded" in log
        frozen = re.findall(r"corral: (.+?): (\d+) objects kept out of the cyclic GC", log)
        assert [when for when, _ in frozen] == [
            "the servers are built",
            "--load-model's models are loaded",
        ]
        assert 10_000 < int(frozen[0][1]) < int(frozen[1][1])
        tensor = InferInput("X", [3, 4], "FP32")
        tensor.set_data_from_numpy(X)
        np.testing.assert_allclose(
            client.infer("mlp", [tensor]).as_numpy("Y"), expected_mlp(), rtol=1e-6
        )
        assert not client.is_model_ready("tree")  # not loaded, and asking does not load it
        with pytest.raises(InferenceServerException) as refused:
            client.infer("tree", [tensor])
        assert refused.value.message().startswith("Request for unknown model: 'tree' is not loaded")
        client.load_model("tree")
        assert client.is_model_ready("tree")
        assert client.infer("tree", [tensor]).as_numpy("Y").shape == (3, 1)
        client.unload_model("tree")
        assert not client.is_model_ready("tree")
        with pytest.raises(InferenceServerException, match="is not loaded"):
            client.infer("tree", [tensor])
    finally:
        client.close()
        stop_server(served)


def test_a_model_that_fails_to_load_at_start_stops_the_server(triton_repo: Path, tmp_path: Path):
    served = start_server(
        triton_repo, tmp_path / "broken.log", "--load-model", "mlp", "--load-model", "broken"
    )
    try:
        assert served.process.wait(timeout=60) == 1
    finally:
        if served.process.poll() is None:
            served.process.kill()
            served.process.wait(timeout=10)
    log = served.log.read_text()
    assert re.search(r"--load-model: [12] of 2 done: broken failed: ", log)
    assert "--load-model: 1 model(s) failed to load, so the server stops" in log
    assert "broken loaded" not in log


def test_a_kserve_v1_request_is_told_the_server_speaks_v2(server: ServerProcess):
    """Issue 48: a v1 request got a bare 404; on either edge it now names the v2 protocol."""
    body = json.dumps({"instances": [[1.0, 2.0, 3.0, 4.0]]}).encode()
    status, _, answer = raw(server, "POST", "/v1/models/mlp:predict", body)
    assert status == 404
    error = json.loads(answer)["error"]
    assert "corral serves the KServe v2 protocol" in error
    assert "POST /v2/models/{model}/infer" in error


def test_a_tritonserver_command_line_serves_its_good_models(triton_repo: Path, tmp_path: Path):
    """Issue 48: the usual tritonserver flags, as a deployment writes them, are each honoured
    or named; with --exit-on-error=false the good models serve and the broken one is named."""
    import tritonclient.http as httpclient
    from tritonclient.http import InferInput

    no_effect = [
        "--metrics-interval-ms=1000",
        "--http-thread-count=8",
        "--grpc-infer-allocation-pool-size=16",
        "--reuse-http-port=false",
    ]
    served = start_server(
        triton_repo,
        tmp_path / "tritonserver.log",
        f"--model-repository={triton_repo}",
        f"--model-store={triton_repo}",
        "--strict-model-config=false",
        "--log-verbose=1",
        "--exit-on-error=false",
        "--strict-readiness=false",
        "--allow-http=true",
        "--allow-grpc=true",
        "--allow-metrics=false",
        "--model-control-mode=explicit",
        "--load-model=*",
        "--model-load-thread-count=2",
        "--backend-config=onnxruntime,enable-mem-arena=1",
        "--backend-config=python,shm-default-byte-size=1048576",
        "--exit-timeout-secs=10",
        "--id=triton",
        "--http-address=127.0.0.1",
        "--grpc-address=127.0.0.1",
        "--grpc-keepalive-time=7200000",
        *no_effect,
    )
    client = httpclient.InferenceServerClient(served.http)
    try:
        wait_until(client.is_server_ready, timeout=60)  # --strict-readiness=false
        assert client.get_server_metadata()["name"] == "triton"  # --id
        tensor = InferInput("X", [3, 4], "FP32")
        tensor.set_data_from_numpy(X)
        np.testing.assert_allclose(
            client.infer("mlp", [tensor]).as_numpy("Y"), expected_mlp(), rtol=1e-6
        )
        assert not client.is_model_ready("broken")
        log = served.log.read_text()
    finally:
        client.close()
        stop_server(served)
    assert re.search(r"--load-model: \d of 6 done: broken failed: ", log)
    assert "broken loaded" not in log
    assert "1 model(s) failed to load and are not served (broken)" in log
    for flag in no_effect:
        assert log.count(f"Triton's {flag} has no effect here: ") == 1, flag
    assert log.count("Triton's --allow-metrics=false: corral serves no metrics port") == 1
    assert "--backend-config python,shm-default-byte-size=1048576 has no effect here" in log


def test_strict_readiness_holds_ready_while_a_model_of_the_start_failed(
    triton_repo: Path, tmp_path: Path
):
    """Triton's default --strict-readiness=true: the good models serve, the server is not
    ready while one it was told to load is not (issue 48)."""
    import tritonclient.http as httpclient
    from tritonclient.http import InferInput

    served = start_server(
        triton_repo,
        tmp_path / "strict.log",
        "--load-model",
        "mlp",
        "--load-model",
        "broken",
        "--exit-on-error",
        "false",
    )
    client = httpclient.InferenceServerClient(served.http)
    try:
        wait_until(lambda: "--load-model: 1 model(s) failed" in served.log.read_text(), 60)
        assert client.is_server_live()
        assert not client.is_server_ready()
        tensor = InferInput("X", [3, 4], "FP32")
        tensor.set_data_from_numpy(X)
        np.testing.assert_allclose(
            client.infer("mlp", [tensor]).as_numpy("Y"), expected_mlp(), rtol=1e-6
        )
        assert "the server is not ready until each is loaded" in served.log.read_text()
    finally:
        client.close()
        stop_server(served)


# -- parameters corral does not honour are refused by name ---------------------------------


@pytest.mark.parametrize(
    ("kwargs", "named", "why"),
    [
        ({"parameters": {"max_tokens": 5}}, "max_tokens", "does not honour"),
    ],
    ids=["custom"],
)
@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_a_request_parameter_corral_does_not_honour_is_refused_by_name(
    transport: str,
    kwargs: dict[str, Any],
    named: str,
    why: str,
    http_client: Any,
    grpc_client: Any,
):
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    module, client = (httpclient, http_client) if transport == "http" else (grpcclient, grpc_client)
    tensor = module.InferInput("X", list(X.shape), "FP32")
    tensor.set_data_from_numpy(X)
    with pytest.raises(InferenceServerException) as refused:
        client.infer("mlp", [tensor], **kwargs)
    assert named in str(refused.value)
    assert why in str(refused.value)
    # The same request without it is answered: nothing else was wrong with it.
    answer = client.infer("mlp", [tensor])
    np.testing.assert_array_equal(
        answer.as_numpy("Y"), reference_run(build_mlp(seed=1), {"X": X})[0]
    )


def test_priorities_and_sequences_are_answered_as_triton_answers_them_named_once_per_model(
    server: ServerProcess, http_client: Any, grpc_client: Any
):
    """Triton 2.51 answers these on a model without priority levels or a sequence batcher
    (every model corral serves) as it would without them: corral too.

    Each parameter is named in the log the first time a model's request gives it, once. A
    value not of its kind is refused naming it.
    """
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    answers = []
    for module, client, given in [
        (httpclient, http_client, {"priority": 2}),
        (grpcclient, grpc_client, {"priority": 7, "sequence_id": 7, "sequence_start": True}),
        (httpclient, http_client, {"priority": 2**64 - 1, "sequence_id": 7}),
        (httpclient, http_client, {"sequence_id": "a-uuid", "sequence_end": True}),
        (grpcclient, grpc_client, {"sequence_id": "a-uuid", "sequence_end": True}),
    ]:
        tensor = module.InferInput("X", list(X.shape), "FP32")
        tensor.set_data_from_numpy(X)
        answers.append(client.infer("mlp", [tensor], **given).as_numpy("Y"))
    for answer in answers:
        np.testing.assert_array_equal(answer, expected_mlp())
    keys = ("priority", "sequence_id", "sequence_start", "sequence_end")
    lines = [f"corral: model 'mlp': a request gave {key}=" for key in keys]
    wait_until(lambda: all(line in server.log.read_text() for line in lines), 30)
    log = server.log.read_text()
    assert [log.count(line) for line in lines] == [1, 1, 1, 1], log[-3000:]
    for key, value, kind in [
        ("priority", "high", b"must be an unsigned integer"),
        ("priority", -1, b"must be an unsigned integer"),
        ("priority", True, b"must be an unsigned integer"),
        # A fraction is refused as no parameter's value at all, by the JSON codec.
        ("priority", 2.5, b"with a fraction"),
        ("sequence_id", -1, b"must be an unsigned integer or a string"),
        ("sequence_id", False, b"must be an unsigned integer or a string"),
        ("sequence_start", 1, b"must be a boolean"),
        ("sequence_end", "yes", b"must be a boolean"),
    ]:
        body = json.loads(infer_json())
        body["parameters"] = {key: value}
        status, _, text = raw(server, "POST", "/v2/models/mlp/infer", json.dumps(body).encode())
        assert status == 400, (key, value, text)
        assert f"'{key}'".encode() in text, text
        assert kind in text, text


def test_an_input_or_output_parameter_corral_does_not_honour_is_refused_by_name(
    server: ServerProcess,
):
    def infer(input_parameters: dict[str, Any], output_parameters: dict[str, Any]) -> Any:
        body = {
            "inputs": [
                {
                    "name": "X",
                    "datatype": "FP32",
                    "shape": list(X.shape),
                    "data": X.ravel().tolist(),
                    "parameters": input_parameters,
                }
            ],
            "outputs": [{"name": "Y", "parameters": output_parameters}],
        }
        return raw(server, "POST", "/v2/models/mlp/infer", json.dumps(body).encode())

    status, _, body = infer({"content_type": "np"}, {})
    assert status == 400
    assert "input 'X' has the parameter 'content_type'" in json.loads(body)["error"]
    status, _, body = infer({}, {"top_k": 3})
    assert status == 400
    assert "requested output 'Y' has the parameter 'top_k'" in json.loads(body)["error"]
    status, _, body = infer({}, {})
    assert status == 200, body
