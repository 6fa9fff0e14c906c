"""Every failed inference request counted, per model and reason (issue 33, item 7).

A model whose load fails had no failure metric and no errors/s, so the docs' error-ratio alert
could never fire for it. Here: the counters and their reasons, the metrics page, the status
page's errors/s, and the docs' alert expression (read from docs/operations.md, not copied)
evaluated over two scrapes of a real server with a broken model.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml

import corral
from corral import Host
from corral._compute.counters import REQUEST_FAILURE_REASONS, HostCounters, request_failure_reason
from corral.protocol import DataPlane
from corral.protocol.types import InferInput, InferRequest
from corral.server.observe.metrics import Metrics
from corral.server.observe.status import StatusBoard, StatusQuery
from tests.helpers import ROOT, add_model
from tests.processes import serving
from tests.promql import Scrape, evaluate

X = np.ones((2, 4), np.float32)
GOOD = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [2, 4], "data": [1.0] * 8}]}


def request(data: np.ndarray = X) -> InferRequest:
    return InferRequest(inputs=(InferInput("X", "FP32", data.shape, data),))


def doc_alert(name: str) -> str:
    """The ``expr`` of alert ``name`` in docs/operations.md's example rules, as written there."""
    text = (ROOT / "docs" / "operations.md").read_text()
    rules = yaml.safe_load(text.split("## Alerts", 1)[1].split("```yaml", 1)[1].split("```")[0])
    (rule,) = [r for g in rules["groups"] for r in g["rules"] if r.get("alert") == name]
    return str(rule["expr"])


@pytest.fixture
def broken_repo(repo: Path) -> Path:
    add_model(repo, "broken", b"not an onnx model")
    return repo


def test_each_failure_is_counted_under_its_reason():
    counters = HostCounters()
    counters.count_request(("m", 1), 10, ok=False, reason="unloadable")
    counters.count_request(("m", 1), 10, ok=False, reason="unloadable")
    counters.count_request(("m", 1), 10, ok=False, reason="inference")
    counters.count_request(("m", 1), 10, ok=True)
    counters.count_unattributed_failure(10, "unknown_model")
    (stats,) = counters.request_stats().values()
    assert (stats.success_count, stats.fail_count) == (1, 3)
    assert stats.failures_by_reason == (("unloadable", 2), ("inference", 1))
    assert counters.unattributed_failures()["unknown_model"] == 1
    assert set(counters.unattributed_failures()) == set(REQUEST_FAILURE_REASONS)
    assert counters.request_latency().count == 5  # the unattributed one's time too
    with pytest.raises(KeyError):
        counters.count_request(("m", 1), 10, ok=False, reason="free text")


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (corral.InvalidInput("bad"), "invalid_input"),
        (corral.ModelNotFound("no"), "unknown_model"),
        (corral.ModelInvalid("not ONNX"), "unloadable"),
        (corral.ModelConfigError("bad toml"), "unloadable"),
        (corral.ModelTooLarge("big"), "unloadable"),
        (corral.LoadTimeout("slow"), "load_failed"),
        (corral.ModelLoadError("storage"), "load_failed"),
        (corral.Overloaded("full"), "overloaded"),
        (corral.DeadlineExceeded("late"), "deadline"),
        (corral.RunCancelled("stopped"), "cancelled"),
        (corral.InferenceError("raised"), "inference"),
        (corral.HostClosed("closing"), "unavailable"),
        (ValueError("?"), "other"),
    ],
)
def test_request_failure_reasons(error: Exception, reason: str):
    assert request_failure_reason(error) == reason


def test_requests_to_a_model_that_failed_to_load_are_counted_and_rendered(broken_repo: Path):
    with Host(broken_repo) as host:
        plane = DataPlane(host)

        async def traffic() -> None:
            for _ in range(3):
                with pytest.raises(corral.ModelInvalid):
                    await plane.infer("broken", None, request())
            with pytest.raises(corral.ModelNotFound):
                await plane.infer("nope", None, request())
            await plane.infer("mlp", None, request())
            with pytest.raises(corral.InvalidInput):
                await plane.infer("mlp", None, request(np.ones((2, 3), np.float32)))
            with pytest.raises(corral.ModelNotFound):
                await plane.infer("mlp", "7", request())

        asyncio.run(traffic())
        text = Metrics(plane).render()[0].decode()
        stats = {row.name: row for row in plane.statistics_snapshot()}

    assert stats["broken"].fail.count == 3
    assert '\nnv_inference_request_failure{model="broken",version="1",reason="OTHER"} 3\n' in text
    assert '\nnv_inference_request_failure{model="broken",version="1",reason="BACKEND"} 0\n' in text
    assert '\nnv_inference_request_failure{model="mlp",version="1",reason="OTHER"} 1\n' in text
    failures = "corral_request_failures_total"
    assert f'\n{failures}{{model="broken",version="1",reason="unloadable"}} 3\n' in text
    assert f'\n{failures}{{model="mlp",version="1",reason="invalid_input"}} 1\n' in text
    # An unknown model, or a version a model does not have: by reason alone.
    assert f'\n{failures}{{reason="unknown_model"}} 2\n' in text
    assert f'\n{failures}{{reason="inference"}} 0\n' in text


def test_the_status_pages_errors_per_second_count_a_failed_load(broken_repo: Path):
    with Host(broken_repo) as host:
        plane = DataPlane(host)
        board = StatusBoard(plane, repository="models")
        board.sample_models()

        async def failing() -> None:
            for _ in range(4):
                with pytest.raises(corral.ModelInvalid):
                    await plane.infer("broken", None, request())
            with pytest.raises(corral.ModelNotFound):
                await plane.infer("nope", None, request())

        asyncio.run(failing())
        board.sample_models()
        document = board.document(StatusQuery())

    window = document["models"]["window_s"]
    (row,) = [r for r in document["models"]["rows"] if r["name"] == "broken"]
    assert row["errors_per_s"] > 0
    assert "not an ONNX model" in row["last_error"]
    # The server's figure: the broken model's 4 and the unknown model's 1.
    assert document["server"]["errors_per_s"] == pytest.approx(
        row["errors_per_s"] * 5 / 4, rel=1e-6
    )
    assert window is not None


def test_the_evaluator_reads_the_subset_and_refuses_the_rest():
    before = Scrape.parse('# TYPE a counter\na{m="x"} 1\na{m="y"} 10\n', at=0.0)
    after = Scrape.parse('# TYPE a counter\na{m="x"} 5\na{m="y"} 14\n', at=2.0)
    ratio = evaluate(
        'sum by (m) (rate(a{m="x"}[5m])) / sum by (m) (rate(a[5m])) > 0.5', before, after
    )
    assert ratio == {frozenset({("m", "x")}): 1.0}
    assert evaluate("sum (rate(a[5m])) > 5", before, after) == {}
    with pytest.raises(SyntaxError):
        evaluate("avg(rate(a[5m]))", before, after)


@pytest.mark.timeout(120)
def test_the_docs_error_ratio_alert_fires_for_a_broken_model_on_a_real_server(
    broken_repo: Path, tmp_path: Path
):
    expression = doc_alert("CorralErrorRatioHigh")
    assert "nv_inference_request_failure" in expression  # the doc's text, as it stands
    with (
        serving(broken_repo, tmp_path / "serve.log") as served,
        httpx.Client(base_url=f"http://{served.http}", timeout=60) as client,
    ):

        def infer(model: str) -> int:
            return client.post(f"/v2/models/{model}/infer", json=GOOD).status_code

        def scrape() -> Scrape:
            page = client.get("/metrics")
            assert page.status_code == 200
            return Scrape.parse(page.text, at=time.monotonic())

        # One of each first: a series needs a sample before the window for a rate.
        assert infer("mlp") == 200
        assert infer("broken") == 400
        before = scrape()
        statuses = [infer("broken") for _ in range(10)] + [infer("mlp") for _ in range(30)]
        after = scrape()

    assert statuses == [400] * 10 + [200] * 30
    # What the alert reads, evaluated by tests/promql.py: the doc's expression over the two
    # scrapes, rate as the slope between them; the rule's "for: 10m" is not waited out.
    fired = evaluate(expression, before, after)
    # 10 failed of 40 answered between the scrapes: 0.25, past the rule's 0.05.
    assert isinstance(fired, dict)
    assert list(fired.values()) == [pytest.approx(0.25)], fired
    assert list(fired) == [frozenset({("instance", "corral")})]


def test_a_failure_before_a_version_is_leased_counts_for_a_version_the_host_knows(repo: Path):
    with Host(repo) as host:
        host.load("mlp")  # its entry is read: version 1
        error = corral.InvalidInput("bad")
        host.count_failed_request("mlp", None, 10, error)  # the newest: 1
        host.count_failed_request("mlp", "1", 10, error)
        host.count_failed_request("mlp", "9", 10, error)  # no such version: apart
        host.count_failed_request("mlp", "latest", 10, error)  # not a number: apart
        host.count_failed_request("tree", None, 10, error)  # not read yet: apart
        host.count_failed_request("nope", None, 10, corral.ModelNotFound("nope"))
        stats = host.request_stats()
        apart = host.unattributed_failures()
    assert stats[("mlp", 1)].failures_by_reason == (("invalid_input", 2),)
    assert set(stats) == {("mlp", 1)}
    assert (apart["invalid_input"], apart["unknown_model"]) == (3, 1)
