"""The metrics an operator alerts on: latency histograms, refusals, load failures, process.

Each counter is driven by the test that reads it; nothing is set by hand.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from pathlib import Path

import numpy as np
import prometheus_client
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

import corral
from corral import Host
from corral._compute.counters import (
    LOAD_FAILURE_REASONS,
    REQUEST_SECONDS_BUCKETS,
    HostCounters,
    load_failure_reason,
)
from corral._compute.queue import QueueStats
from corral.protocol import DataPlane, InferInput, InferRequest, ModelControl
from corral.protocol.control import ControlThreads
from corral.server.bodies import BodyBudget, BodyBudgetExceeded
from corral.server.observe.metrics import REFUSAL_REASONS, Metrics
from corral.testing import build_linear, build_mlp
from tests.gates import CallGate, RunGate, hold_compute_workers, served_version
from tests.helpers import ROOT, add_model, wait_until
from tests.promql import Scrape, evaluate

SERVER_LATENCY = "corral_request_duration_seconds"
MODEL_LATENCY = "corral_model_request_duration_seconds"


def request(rows: int = 1, features: int = 4) -> InferRequest:
    data = np.ones((rows, features), np.float32)
    return InferRequest(inputs=(InferInput("X", "FP32", data.shape, data),))


def parse(body: bytes) -> dict[str, list[Sample]]:
    return {family.name: family.samples for family in text_string_to_metric_families(body.decode())}


def histogram(samples: list[Sample], **labels: str) -> dict[str, float]:
    """One histogram's series: each bucket by its ``le``, and ``count`` and ``sum``."""
    series: dict[str, float] = {}
    for sample in samples:
        own = {k: v for k, v in sample.labels.items() if k != "le"}
        if own != labels:
            continue
        if sample.name.endswith("_bucket"):
            series[sample.labels["le"]] = sample.value
        else:
            series[sample.name.rsplit("_", 1)[1]] = sample.value
    return series


def by_label(samples: list[Sample], label: str) -> dict[str, float]:
    return {s.labels[label]: s.value for s in samples}


def only_value(samples: list[Sample]) -> float:
    (sample,) = samples
    return sample.value


def assert_cumulative(series: dict[str, float]) -> None:
    """The buckets are corral's bounds in order, never decreasing, ending at +Inf = count."""
    bounds = [key for key in series if key not in ("count", "sum")]
    assert bounds == [repr(b) for b in REQUEST_SECONDS_BUCKETS] + ["+Inf"]
    counts = [series[bound] for bound in bounds]
    assert counts == sorted(counts)
    assert series["+Inf"] == series["count"]


# -- latency histograms ------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_latency_histograms_count_every_request_server_wide_and_per_model(repo: Path):
    with Host(repo, model_latency_histograms=1) as host:
        plane = DataPlane(host)

        async def traffic() -> None:
            for _ in range(3):
                await plane.infer("mlp", None, request())
            with pytest.raises(corral.InvalidInput):
                await plane.infer("mlp", None, request(features=3))
            for _ in range(2):
                await plane.infer("tree", None, request())

        asyncio.run(traffic())
        families = parse(Metrics(plane).render()[0])

    server = histogram(families[SERVER_LATENCY])
    assert_cumulative(server)
    assert server["count"] == 6  # answered and failed alike
    assert server["sum"] > 0
    # Only the first version asked has a histogram of its own: model_latency_histograms=1.
    mlp = histogram(families[MODEL_LATENCY], model="mlp", version="1")
    assert_cumulative(mlp)
    assert mlp["count"] == 4
    assert 0 < mlp["sum"] <= server["sum"]
    assert {s.labels["model"] for s in families[MODEL_LATENCY]} == {"mlp"}


def test_latency_buckets_place_each_duration_at_its_bound():
    counters = HostCounters(model_latency_histograms=0)
    for duration_ns in (400_000, 500_000, 700_000, 30_000_000, 20_000_000_000):
        counters.count_request(("m", 1), duration_ns, ok=True)
    latency = counters.request_latency()
    buckets = dict(latency.buckets)
    # A bound holds the values at or under it; 20 s is past the last bound: +Inf only.
    assert (buckets[0.0005], buckets[0.001], buckets[0.025], buckets[0.05]) == (2, 3, 3, 4)
    assert buckets[10.0] == 4
    assert latency.count == 5
    assert latency.sum_seconds == pytest.approx(20.0316)
    assert counters.model_request_latency() == {}  # none per model when 0


def test_per_model_histograms_go_to_the_first_versions_asked_and_stay():
    counters = HostCounters(model_latency_histograms=2)
    for key in (("a", 1), ("b", 1), ("c", 1), ("a", 1), ("c", 2)):
        counters.count_request(key, 1_000_000, ok=True)
    latencies = counters.model_request_latency()
    assert {key: latency.count for key, latency in latencies.items()} == {("a", 1): 2, ("b", 1): 1}


def test_model_latency_histograms_is_checked():
    with pytest.raises(corral.InvalidOption, match="model_latency_histograms"):
        corral.HostOptions(model_latency_histograms=-1)


# -- Triton's compute stages, from a real batched run ----------------------------------------


@pytest.mark.timeout(60)
def test_compute_input_and_output_durations_come_from_a_real_batched_run(tmp_path: Path):
    add_model(tmp_path, "slow", build_linear(), toml="max_batch_size = 0\n")
    add_model(tmp_path, "a", build_mlp(seed=1))
    with Host(tmp_path) as host:
        plane = DataPlane(host)
        assert host.preload() == {}
        with host.acquire("a") as lease:
            gate = RunGate(served_version(lease))
        gate.open.set()  # a's runs are only counted
        held, blockers = hold_compute_workers(host)
        try:  # every worker is held: a's requests all queue, to be taken together
            queued = [host.submit("a", {"X": np.full((2, 4), i, np.float32)}) for i in range(6)]
        finally:
            held.open.set()
        for future in [*blockers, *queued]:
            future.result(timeout=30)
        row = next(row for row in plane.statistics_snapshot() if row.name == "a")
        families = parse(Metrics(plane).render()[0])

    assert max(gate.rows) > 2, f"no run batched requests: {gate.rows}"
    # A batched run copies its requests in and its outputs out: both take time.
    assert row.compute_input.ns > 0
    assert row.compute_output.ns > 0
    assert row.compute_input.count == row.compute_output.count == len(gate.rows)
    for stage in ("compute_input", "compute_output", "compute_infer"):
        got = {s.labels["model"]: s.value for s in families[f"nv_inference_{stage}_duration_us"]}
        assert got["a"] == getattr(row, stage).ns // 1000, stage


# -- refused, expired, cancelled -------------------------------------------------------------


@pytest.mark.timeout(60)
def test_queue_full_expired_and_cancelled_requests_are_counted(tmp_path: Path):
    # One run per request, so that each blocker holds one compute worker.
    add_model(tmp_path, "slow", build_linear(), toml="max_batch_size = 0\n")
    add_model(tmp_path, "linear", build_linear(), toml="max_batch_size = 0\n")
    limit = max(2, corral.runtime().options.compute_workers)  # the blockers fit too
    x = {"X": np.ones((1, 4), np.float32)}
    with Host(tmp_path, max_queue_per_model=limit) as host:
        plane = DataPlane(host)
        assert host.preload() == {}
        gate, blockers = hold_compute_workers(host)
        try:
            expiring = host.submit("linear", x, timeout=0.01)
            expires_at = time.monotonic() + 0.01
            cancelled = host.submit("linear", x)
            assert cancelled.cancel()
            rest = [host.submit("linear", x) for _ in range(limit - 2)]
            with pytest.raises(corral.Overloaded):
                host.submit("linear", x)  # the queue holds `limit` requests
            wait_until(lambda: time.monotonic() > expires_at)
        finally:
            gate.open.set()
        for future in [*blockers, *rest]:
            future.result(timeout=30)
        with pytest.raises(corral.DeadlineExceeded):
            expiring.result(timeout=30)
        wait_until(lambda: host.queue_stats()[("linear", 1)].cancelled == 1)
        families = parse(Metrics(plane).render()[0])

    refused = by_label(families["corral_requests_refused"], "reason")
    assert refused == {"queue_full": 1, "server_overloaded": 0, "body_budget": 0, "control_busy": 0}
    assert only_value(families["corral_requests_expired"]) == 1
    assert only_value(families["corral_requests_cancelled"]) == 1


@pytest.mark.timeout(60)
def test_body_budget_and_control_plane_refusals_are_counted(repo: Path):
    budget = BodyBudget(100)
    with budget.reserve(60), pytest.raises(BodyBudgetExceeded):
        budget.reserve(41)
    threads = ControlThreads(limit=1)
    gate = CallGate()
    with Host(repo) as host:
        plane = DataPlane(host, control=ModelControl(host, threads=threads))

        async def refused_while_held() -> None:
            held = asyncio.ensure_future(threads.run("a held call", None, gate.hold))
            assert await asyncio.to_thread(gate.reached.wait, 10)
            try:
                with pytest.raises(corral.Overloaded):
                    await plane.model_statistics()
            finally:
                gate.opened.set()
                await held

        asyncio.run(refused_while_held())
        families = parse(Metrics(plane, budget).render()[0])
        with budget.reserve(30):
            holding = parse(Metrics(plane, budget).render()[0])

    refused = by_label(families["corral_requests_refused"], "reason")
    assert refused == {"queue_full": 0, "server_overloaded": 0, "body_budget": 1, "control_busy": 1}
    assert set(refused) == set(REFUSAL_REASONS)
    # What the budget holds now, and its limit: 0 once the reservations are given back.
    assert only_value(families["corral_body_bytes_held"]) == 0
    assert only_value(holding["corral_body_bytes_held"]) == 30
    assert only_value(holding["corral_body_bytes_limit"]) == 100


def test_refusals_of_a_full_queue_and_of_all_queues_are_told_apart(
    repo: Path, monkeypatch: pytest.MonkeyPatch
):
    # The scheduler's own test drives both (test_scheduler_units.py); here, their mapping.
    figures = {"accepted": 9, "expired": 0, "cancelled": 0, "pending": 0, "runs": 0, "rows": 0}
    queues = {
        ("a", 1): QueueStats(
            **figures,
            rejected=5,
            overloaded=2,
            queue_seconds_sum=0.0,
            compute_seconds_sum=0.0,
            batch_rows_buckets=(),
        ),
        ("b", 1): QueueStats(
            **figures,
            rejected=1,
            overloaded=1,
            queue_seconds_sum=0.0,
            compute_seconds_sum=0.0,
            batch_rows_buckets=(),
        ),
    }
    with Host(repo) as host:
        monkeypatch.setattr(host, "queue_stats", lambda: queues)
        families = parse(Metrics(DataPlane(host)).render()[0])

    refused = by_label(families["corral_requests_refused"], "reason")
    assert (refused["queue_full"], refused["server_overloaded"]) == (3, 3)


# -- loads: failures by reason, unloads, reloads, evictions ----------------------------------


def test_every_error_class_maps_to_a_fixed_reason():
    assert load_failure_reason(corral.ModelConfigError("x")) == "invalid_config"
    assert load_failure_reason(corral.UploadRefused("x")) == "invalid_config"
    assert load_failure_reason(corral.ModelTooLarge("x")) == "too_large"
    assert load_failure_reason(corral.LoadTimeout("x")) == "timeout"
    assert load_failure_reason(corral.ModelNotFound("x")) == "not_found"
    assert load_failure_reason(corral.InvalidModelName("x")) == "invalid_name"
    assert load_failure_reason(corral.ProviderUnavailable("x")) == "provider_unavailable"
    assert load_failure_reason(corral.ModelLoadError("x")) == "invalid_model"
    assert load_failure_reason(corral.StoreUnavailable("x")) == "store_unavailable"
    assert load_failure_reason(RuntimeError("free text never becomes a label")) == "other"
    assert load_failure_reason(corral.InferenceError("x")) == "other"
    assert len(set(LOAD_FAILURE_REASONS)) == len(LOAD_FAILURE_REASONS) == 9


@pytest.mark.timeout(60)
def test_load_failures_are_counted_by_reason(tmp_path: Path):
    add_model(tmp_path, "typo", build_mlp(), toml="max_batch_sise = 4\n")
    add_model(tmp_path, "garbage", b"not an onnx model")
    add_model(tmp_path, "big", build_mlp(hidden=512))
    with Host(tmp_path, memory_budget=20_000) as host:
        failures = host.preload()
        assert set(failures) == {"typo", "garbage", "big"}, failures
        families = parse(Metrics(DataPlane(host)).render()[0])
        total = host.stats().load_failures

    counted = by_label(families["corral_model_load_failures"], "reason")
    assert list(counted) == list(LOAD_FAILURE_REASONS)  # every reason, zeros included
    assert {reason: n for reason, n in counted.items() if n} == {
        "invalid_config": 1,
        "invalid_model": 1,
        "too_large": 1,
    }
    assert sum(counted.values()) == total == 3


@pytest.mark.timeout(60)
def test_unloads_reloads_and_evictions_are_counted(tmp_path: Path):
    model = add_model(tmp_path, "a", build_mlp(seed=1))
    add_model(tmp_path, "b", build_mlp(seed=2))
    with Host(tmp_path, max_loaded_models=1) as host:
        plane = DataPlane(host)
        host.load("a")
        host.load("b")  # a is evicted to make room
        host.unload("b")
        host.load("a")
        model.write_bytes(build_mlp(seed=3))
        later = time.time() + 5  # a fingerprint that surely changed
        os.utime(model, (later, later))
        host.load("a")  # a changed model in use: swapped for a fresh copy
        families = parse(Metrics(plane).render()[0])

    assert only_value(families["corral_model_evictions"]) == 1
    assert only_value(families["corral_model_unloads"]) == 1
    assert only_value(families["corral_model_reloads"]) == 1
    assert only_value(families["corral_model_loads"]) == 3


# -- the standard collectors -----------------------------------------------------------------


def test_process_platform_and_gc_families_are_in_the_metrics_own_registry(repo: Path):
    with Host(repo) as host:
        families = parse(Metrics(DataPlane(host)).render()[0])

    assert only_value(families["process_resident_memory_bytes"]) > 0
    assert only_value(families["process_open_fds"]) > 0
    assert by_label(families["python_info"], "implementation") == {"CPython": 1.0}
    assert {s.labels["generation"] for s in families["python_gc_collections"]} == {"0", "1", "2"}
    # Each Metrics has its own: nothing was added to prometheus-client's global registry.
    before = set(prometheus_client.REGISTRY._names_to_collectors)
    with Host(repo) as host:
        Metrics(DataPlane(host))
    assert set(prometheus_client.REGISTRY._names_to_collectors) == before


# -- the scrape's size at 10,000 model versions ------------------------------------------------

#: The page's size at 10,000 counted versions (11-character names), the default 100 per-model
#: histograms: docs/operations.md documents it (9.5 MB measured since the failures carry
#: Triton's four reasons, 6.9 MB before; the figure is the bound).
SCRAPE_BYTES_AT_10000 = 9_600_000


@pytest.mark.timeout(120)
def test_a_scrape_of_ten_thousand_versions_stays_under_the_documented_size(tmp_path: Path):
    with Host(tmp_path) as host:  # the default model_latency_histograms
        for i in range(10_000):
            host.count_request(f"model-{i:05d}", 1 + i % 3, 100_000 * (1 + i % 997), ok=True)
        body, _ = Metrics(DataPlane(host)).render()

    assert len(body) < SCRAPE_BYTES_AT_10000
    # Read by lines, not parsed: parsing 7 MB takes seconds, and the test suite is timed.
    text = body.decode()
    assert text.count("\nnv_inference_request_success{") == 10_000
    counted = set(re.findall(rf'\n{MODEL_LATENCY}_count{{model="([^"]+)"', text))
    assert counted == {f"model-{i:05d}" for i in range(100)}  # the first 100 asked
    assert f"\n{SERVER_LATENCY}_count 10000.0\n" in text


# -- the documented alerts -------------------------------------------------------------------


def test_every_metric_the_alerts_use_exists(repo: Path):
    docs = (ROOT / "docs" / "operations.md").read_text()
    alerts = docs.split("## Alerts", 1)[1].split("```yaml", 1)[1].split("```", 1)[0]
    used = set(re.findall(r"\b((?:nv_inference|corral|process)_\w+)", alerts))
    assert len(used) >= 10, used
    with Host(repo, memory_budget="1GiB") as host:
        plane = DataPlane(host)
        asyncio.run(plane.infer("mlp", None, request()))
        text = Metrics(plane).render()[0].decode()
    # Sample names as Prometheus stores them: counters of corral's own with _total.
    names = set(re.findall(r"^(\w+)[{ ]", text, re.MULTILINE))
    assert used <= names, used - names


def test_request_stats_of_more_versions_than_one_hold_of_the_lock_are_all_exact():
    counters = HostCounters()
    for i in range(1500):  # request_stats copies a few hundred versions per hold of its lock
        for _ in range(1 + i % 3):
            counters.count_request((f"m{i}", 1), 1_000 + i, ok=True)
        counters.count_request((f"m{i}", 1), 7, ok=False)
    stats = counters.request_stats()
    assert len(stats) == 1500
    for i in range(1500):
        got = stats[(f"m{i}", 1)]
        calls = 1 + i % 3
        assert (got.success_count, got.success_ns) == (calls, calls * (1_000 + i))
        assert (got.fail_count, got.fail_ns) == (1, 7)


def test_each_loaded_version_shows_its_charge_beside_its_estimate_and_measure(tmp_path: Path):
    add_model(tmp_path, "a", build_mlp(seed=1))
    add_model(tmp_path, "d", build_mlp(seed=2), toml="memory_bytes = 5000000\n")
    with Host(tmp_path, memory_budget="1GiB", measure_charges=True) as host:
        host.load("a")
        host.load("d")
        wait_until(lambda: all(c.measured is not None for c in host.charges()), timeout=100)
        families = parse(Metrics(DataPlane(host)).render()[0])
        charges = {charge.name: charge for charge in host.charges()}

    samples = {
        (s.labels["model"], s.labels["kind"]): s.value
        for s in families["corral_model_memory_bytes"]
    }
    assert samples[("a", "charged")] == samples[("a", "measured")] == charges["a"].measured
    assert samples[("a", "estimated")] == charges["a"].estimated
    assert ("a", "declared") not in samples
    assert samples[("d", "charged")] == samples[("d", "declared")] == 5_000_000
    assert samples[("d", "measured")] == charges["d"].measured
    assert only_value(families["corral_memory_used_bytes"]) == (charges["a"].measured + 5_000_000)


# -- the autoscaling recipe ------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_the_autoscaling_queries_read_queued_and_refused_requests(tmp_path: Path):
    """deploy/kubernetes/autoscaling.yaml's queries, as written there, over two scrapes."""
    yaml = pytest.importorskip("yaml", reason="the dev extra installs pyyaml")
    recipe = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "autoscaling.yaml").read_text())
    queries = [str(trigger["metadata"]["query"]) for trigger in recipe["spec"]["triggers"]]
    assert len(queries) == 2
    add_model(tmp_path, "slow", build_linear(), toml="max_batch_size = 0\n")
    add_model(tmp_path, "linear", build_linear(), toml="max_batch_size = 0\n")
    limit = 3
    x = {"X": np.ones((1, 4), np.float32)}
    with Host(tmp_path, max_queue_per_model=limit) as host:
        metrics = Metrics(DataPlane(host))
        assert host.preload() == {}
        before = Scrape.parse(metrics.render()[0].decode(), at=0.0)
        gate, blockers = hold_compute_workers(host)
        try:
            queued = [host.submit("linear", x) for _ in range(limit)]
            with pytest.raises(corral.Overloaded):
                host.submit("linear", x)  # refused: queue_full
            after = Scrape.parse(metrics.render()[0].decode(), at=2.0)
        finally:
            gate.open.set()
        for future in [*blockers, *queued]:
            future.result(timeout=30)
    pending, refused = (evaluate(query, before, after) for query in queries)
    # Every worker is held: the three queued requests wait (and the blockers run, counted
    # by neither); one refusal over the two seconds between the scrapes.
    assert pending == {frozenset(): pytest.approx(limit)}, pending
    assert refused == {frozenset(): pytest.approx(0.5)}, refused
