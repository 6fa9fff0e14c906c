"""Error texts name models and tensors, not the server's folders; the server's log keeps them.

A real ``corral serve`` (explicit model control) over a repository of broken models: an ONNX
file that is not one, a malformed config.pbtxt, a malformed model.toml, a folder with no
version, a model that is not there, and an upload whose file is not ONNX. Every answer over
HTTP and gRPC (the loads, the repository index) must name the model, and none may hold the
repository's absolute path or an upload folder; the log must hold the repository's path.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import grpc
import httpx
import pytest

from corral.protocol.proto import grpc_service_pb2 as pb
from corral.protocol.proto import grpc_service_pb2_grpc as pb_grpc
from corral.testing import build_mlp
from tests.helpers import Figure, add_model
from tests.processes import start_server, stop_server

BROKEN = ("badonnx", "badpbtxt", "badtoml", "noversion", "missing")


def broken_repository(root: Path) -> Path:
    repo = (root / "models").resolve()
    add_model(repo, "badonnx", b"not an onnx model")
    add_model(repo, "badpbtxt", build_mlp(n_features=4, seed=1))
    (repo / "badpbtxt" / "config.pbtxt").write_text("max_batch_size: ][\n")
    add_model(repo, "badtoml", build_mlp(n_features=4, seed=1))
    (repo / "badtoml" / "model.toml").write_text("[[[\n")
    (repo / "noversion").mkdir()
    return repo


@pytest.mark.timeout(120)
def test_no_answer_names_a_server_folder_while_the_log_does(tmp_path: Path, figure: Figure):
    repo = broken_repository(tmp_path)
    served = start_server(repo, tmp_path / "serve.log", "--model-control-mode", "explicit")
    answers: list[tuple[str, str]] = []
    try:
        with (
            httpx.Client(base_url=f"http://{served.http}", timeout=60) as client,
            grpc.insecure_channel(served.grpc) as channel,
        ):
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            for name in BROKEN:
                answer = client.post(f"/v2/repository/models/{name}/load")
                assert answer.status_code in (400, 404), answer.text
                answers.append((f"HTTP load {name}", answer.json()["error"]))
                with pytest.raises(grpc.RpcError) as refused:
                    stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name=name))
                answers.append((f"gRPC load {name}", refused.value.details()))
            garbage = base64.b64encode(b"not onnx either").decode()
            answer = client.post(
                "/v2/repository/models/uploaded/load",
                json={"parameters": {"config": "{}", "file:1/model.onnx": garbage}},
            )
            assert answer.status_code == 400, answer.text  # the request's own files
            answers.append(("HTTP load with files", answer.json()["error"]))
            index = client.post("/v2/repository/index", json={})
            assert index.status_code == 200
            answers += [
                (f"HTTP index {row['name']}", row.get("reason", "")) for row in index.json()
            ]
            rows = stub.RepositoryIndex(pb.RepositoryIndexRequest()).models
            answers += [(f"gRPC index {row.name}", row.reason) for row in rows]
            # The status page's documents: failures, events and problems, as texts. (Its
            # "repository" field shows the folder the operator gave, on purpose.)
            board = client.get("/v2/corral/status").json()
            del board["server"]["repository"]
            answers.append(("status", json.dumps(board)))
            for name in BROKEN[:-1]:
                document = client.get(f"/v2/corral/status/models/{name}")
                assert document.status_code == 200, document.text
                answers.append((f"status of {name}", document.text))
    finally:
        stop_server(served)
    for what, text in answers:
        assert str(repo) not in text, (what, text)
        assert "corral-uploads-" not in text, (what, text)
    named = {name for name in BROKEN if any(name in text for _, text in answers)}
    assert named == set(BROKEN)  # each answer still says which model failed
    assert "uploaded/1/model.onnx" in dict(answers)["HTTP load with files"]
    log = served.log.read_text()
    assert str(repo) in log  # the server's own log keeps the whole path
    figure("answers checked for server paths", len(answers))
