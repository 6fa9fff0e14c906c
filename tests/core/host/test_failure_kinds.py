"""Failures that will not pass apart from those that may (issue 33, item 6).

A model whose files cannot be served as they are (not ONNX, a refused model.toml or
config.pbtxt) answers 400 / FAILED_PRECONDITION, every time, until its files change; a load
request whose own config is malformed answers 400 / INVALID_ARGUMENT; only what may pass
(a storage error, a load's timeout, a full budget) answers 503 with Retry-After, or
UNAVAILABLE.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import corral
from corral import Host
from corral._onnx.ort import load_error
from corral.testing import build_mlp
from tests.helpers import add_model
from tests.server.grpc.test_server_grpc import Served, refused, run, triton_input
from tests.server.http.test_server_http import call, infer_body, make_app

X = np.ones((2, 4), dtype=np.float32)
NOT_ONNX = b"not an onnx model"


@pytest.fixture
def broken_repo(repo: Path) -> Path:
    """The common repository, with "broken" (not ONNX), "badtoml" and "badpbtxt"."""
    add_model(repo, "broken", NOT_ONNX)
    add_model(repo, "badtoml", build_mlp(seed=3), toml="max_batch_size = 'many'\n")
    add_model(repo, "badpbtxt", build_mlp(seed=4))
    (repo / "badpbtxt" / "config.pbtxt").write_text("max_batch_size: -3\n")
    return repo


def test_a_model_not_onnx_answers_400_every_time_until_its_file_changes(broken_repo: Path):
    with Host(broken_repo, failure_backoff_s=(60.0, 60.0)) as host:
        app = make_app(host)
        for _ in range(2):  # the load, then the failure kept through its back-off
            answer = call(app, "POST", "/v2/models/broken/infer", json=infer_body(X))
            assert answer.status_code == 400, answer.text
            assert "it is not an ONNX model" in answer.json()["error"]
            assert "retry-after" not in answer.headers
        # Its file changes: the next request loads it again at once, back-off or not.
        add_model(broken_repo, "broken", build_mlp(seed=5))
        answer = call(app, "POST", "/v2/models/broken/infer", json=infer_body(X))
        assert answer.status_code == 200, answer.text


@pytest.mark.parametrize(
    ("model", "words"),
    [("badtoml", "max_batch_size"), ("badpbtxt", "max_batch_size must be >= 0")],
)
def test_a_refused_model_toml_or_config_pbtxt_answers_400_until_it_changes(
    broken_repo: Path, model: str, words: str
):
    with Host(broken_repo, failure_backoff_s=(60.0, 60.0)) as host:
        app = make_app(host)
        for _ in range(2):
            answer = call(app, "POST", f"/v2/models/{model}/infer", json=infer_body(X))
            assert answer.status_code == 400, answer.text
            assert words in answer.json()["error"]
            assert "retry-after" not in answer.headers
        # The refused file goes: the next request loads the model.
        settings = "model.toml" if model == "badtoml" else "config.pbtxt"
        (broken_repo / model / settings).unlink()
        answer = call(app, "POST", f"/v2/models/{model}/infer", json=infer_body(X))
        assert answer.status_code == 200, answer.text


def test_a_load_whose_config_is_not_json_answers_400_and_changes_nothing(repo: Path):
    with Host(repo) as host:
        app = make_app(host)
        body = {"parameters": {"config": "{not json"}}
        answer = call(app, "POST", "/v2/repository/models/mlp/load", json=body)
        assert answer.status_code == 400, answer.text
        assert "not JSON" in answer.json()["error"]
        assert call(app, "POST", "/v2/models/mlp/infer", json=infer_body(X)).status_code == 200


def test_a_load_whose_config_the_model_refuses_answers_400_and_the_files_stay_served(
    repo: Path,
):
    config = '{"input": [{"name": "X", "data_type": "TYPE_INT64", "dims": [-1, 4]}]}'
    with Host(repo) as host:
        app = make_app(host)
        body = {"parameters": {"config": config}}
        answer = call(app, "POST", "/v2/repository/models/mlp/load", json=body)
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"].startswith("failed to load 'mlp': ")
        assert call(app, "POST", "/v2/models/mlp/infer", json=infer_body(X)).status_code == 200


@pytest.mark.parametrize(
    "error",
    [
        corral.ModelLoadError("could not read the model: storage unreachable"),
        corral.LoadTimeout("still reading after 30 s"),
    ],
)
def test_a_failure_that_may_pass_answers_503_with_retry_after(
    repo: Path, monkeypatch: pytest.MonkeyPatch, error: Exception
):
    async def failing(*args: object, **kwargs: object) -> None:
        raise error

    with Host(repo) as host:
        app = make_app(host)
        monkeypatch.setattr(app.plane, "infer", failing)
        answer = call(app, "POST", "/v2/models/mlp/infer", json=infer_body(X))
    assert answer.status_code == 503
    assert answer.headers["retry-after"] == "1"


def test_over_grpc_the_broken_model_is_failed_precondition_and_a_bad_load_invalid_argument(
    broken_repo: Path,
):
    async def scenario(s: Served) -> None:
        for model in ("broken", "badtoml", "badpbtxt"):
            refusal = await refused(s.client.infer(model, [triton_input("X", X, "FP32")]))
            assert refusal.status() == "StatusCode.FAILED_PRECONDITION", (model, refusal)
        load = await refused(s.client.load_model("broken"))
        assert load.status() == "StatusCode.FAILED_PRECONDITION"
        assert load.message().startswith("failed to load 'broken': ")
        bad_config = await refused(s.client.load_model("mlp", config="{not json"))
        assert bad_config.status() == "StatusCode.INVALID_ARGUMENT"
        assert "not JSON" in bad_config.message()
        # JSON, but a config the model refuses: the request's fault too, not the files'.
        refused_config = '{"input": [{"name": "X", "data_type": "TYPE_INT64", "dims": [-1, 4]}]}'
        refusal = await refused(s.client.load_model("mlp", config=refused_config))
        assert refusal.status() == "StatusCode.INVALID_ARGUMENT", refusal
        assert "the load's config or files" in refusal.message()
        # And what was in place stays: the model's own files serve.
        await s.client.infer("mlp", [triton_input("X", X, "FP32")])
        # Storage that may come back: UNAVAILABLE, which clients retry.
        error = corral.ModelLoadError("could not read the model: storage unreachable")

        async def failing(*args: Any, **kwargs: Any) -> None:
            raise error

        s.plane.infer = failing  # type: ignore[method-assign]
        unavailable = await refused(s.client.infer("mlp", [triton_input("X", X, "FP32")]))
        assert unavailable.status() == "StatusCode.UNAVAILABLE"

    run(broken_repo, scenario)


@pytest.mark.parametrize(
    ("ort_class", "kind"),
    [
        ("InvalidProtobuf", corral.ModelInvalid),
        ("InvalidGraph", corral.ModelInvalid),
        ("Fail", corral.ModelInvalid),  # a type mismatch, an opset it does not know
        ("NotImplemented", corral.ModelInvalid),
        ("RuntimeException", corral.ModelLoadError),  # memory, a device: may pass
        ("EPFail", corral.ModelLoadError),
    ],
)
def test_onnxruntimes_refusals_of_the_bytes_are_invalid_and_the_rest_may_pass(
    ort_class: str, kind: type[Exception]
):
    raised = type(ort_class, (Exception,), {})("[ONNXRuntimeError] : 1 : FAIL : it broke")
    error = load_error(raised, b"12345")
    assert type(error) is kind
    assert str(error) == "onnxruntime could not load 5-byte model: FAIL : it broke"


def test_a_model_with_several_problems_is_invalid_only_if_each_is():
    from corral._base.problems import ProblemKind
    from corral._models.model_entry import Problems, make_entry

    def entry(*errors: corral.ModelLoadError) -> corral.ModelLoadError | None:
        problems = Problems("m")
        for error in errors:
            problems.add(ProblemKind.BAD_LAYOUT, error, "m", "fix it")
        return make_entry("m", {}, corral.ModelConfig(), None, problems, layout="folder").error

    both = entry(corral.ModelInvalid("not ONNX"), corral.ModelConfigError("bad toml"))
    assert type(both) is corral.ModelInvalid
    assert str(both) == "model 'm' has 2 problems: not ONNX; bad toml"
    # One that may pass (a file that could not be read): the whole may pass.
    mixed = entry(corral.ModelInvalid("not ONNX"), corral.ModelLoadError("cannot stat: EIO"))
    assert type(mixed) is corral.ModelLoadError
