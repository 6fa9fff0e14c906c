"""Metrics: Triton's per-model families and corral's own, read at scrape time."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import numpy as np
import prometheus_client
import pytest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

import corral
from corral import Host
from corral._compute.queue import QueueStats
from corral.protocol.dataplane import DataPlane
from corral.protocol.response_cache import ResponseCache
from corral.protocol.types import Duration, InferInput, InferRequest, ModelStatistics
from corral.server.observe.metrics import Metrics

TRITON_COUNTERS = (
    "nv_inference_request_success",
    "nv_inference_request_failure",
    "nv_inference_count",
    "nv_inference_exec_count",
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_infer_duration_us",
)
PENDING = "nv_inference_pending_request_count"
CACHE_COUNTERS = (
    "nv_cache_num_hits_per_model",
    "nv_cache_num_misses_per_model",
    "nv_cache_hit_duration_per_model",
    "nv_cache_miss_duration_per_model",
)


def request(rows: int = 1, features: int = 4) -> InferRequest:
    data = np.ones((rows, features), np.float32)
    return InferRequest(inputs=(InferInput("X", "FP32", data.shape, data),))


def parse(body: bytes) -> dict[str, list[Sample]]:
    """Samples by family name, as a Prometheus server would read the page."""
    return {family.name: family.samples for family in text_string_to_metric_families(body.decode())}


def corral_only(families: dict[str, list[Sample]]) -> dict[str, list[Sample]]:
    """The families corral writes, without the standard process and platform ones."""
    return {
        name: samples for name, samples in families.items() if name.startswith(("nv_", "corral_"))
    }


def per_model(samples: list[Sample]) -> dict[tuple[str, str], float]:
    return {(s.labels["model"], s.labels["version"]): s.value for s in samples}


def only_value(samples: list[Sample]) -> float:
    (sample,) = samples
    return sample.value


@pytest.mark.timeout(60)
def test_render_counts_each_model_version_after_real_requests(repo: Path):
    with Host(repo) as host:
        plane = DataPlane(host)
        metrics = Metrics(plane)

        async def traffic() -> None:
            for _ in range(3):
                await plane.infer("mlp", None, request())
            for _ in range(2):
                await plane.infer("tree", "1", request())
            with pytest.raises(corral.InvalidInput):
                await plane.infer("mlp", None, request(features=3))

        asyncio.run(traffic())
        body, content_type = metrics.render()

    assert content_type == CONTENT_TYPE_LATEST
    families = parse(body)
    counts = {name: per_model(families[name]) for name in TRITON_COUNTERS[:4]}
    assert counts == {
        "nv_inference_request_success": {("mlp", "1"): 3, ("tree", "1"): 2},
        "nv_inference_request_failure": {("mlp", "1"): 1, ("tree", "1"): 0},
        "nv_inference_count": {("mlp", "1"): 3, ("tree", "1"): 2},
        # One after another, no two requests share a run.
        "nv_inference_exec_count": {("mlp", "1"): 3, ("tree", "1"): 2},
    }
    durations = {name: per_model(families[name]) for name in TRITON_COUNTERS[4:]}
    for name in ("nv_inference_request_duration_us", "nv_inference_compute_infer_duration_us"):
        assert set(durations[name]) == {("mlp", "1"), ("tree", "1")}
        assert all(value > 0 for value in durations[name].values()), name
    assert all(value >= 0 for value in durations["nv_inference_queue_duration_us"].values())
    assert per_model(families[PENDING]) == {("mlp", "1"): 0, ("tree", "1"): 0}

    assert only_value(families["corral_models_loaded"]) == 2
    assert only_value(families["corral_model_loads"]) == 2
    assert only_value(families["corral_model_evictions"]) == 0
    assert only_value(families["corral_memory_used_bytes"]) > 0
    assert families["corral_memory_budget_bytes"] == []  # no budget: no sample
    assert only_value(families["corral_threads"]) > 0
    load_seconds = {s.name: s for s in families["corral_model_load_seconds"]}
    assert load_seconds["corral_model_load_seconds_count"].value == 2
    assert load_seconds["corral_model_load_seconds_sum"].value > 0
    buckets = [s for s in families["corral_model_load_seconds"] if s.name.endswith("_bucket")]
    assert buckets[-1].labels["le"] == "+Inf"
    assert buckets[-1].value == 2


def test_the_response_cache_has_tritons_families_and_corrals_own(repo: Path):
    (repo / "mlp" / "model.toml").write_text("response_cache = true\n")
    with Host(repo) as host:
        plane = DataPlane(host, response_cache=ResponseCache(1 << 20))

        async def traffic() -> None:
            for _ in range(3):
                await plane.infer("mlp", None, request())  # one miss, two hits
            await plane.infer("tree", None, request())  # not enabled: neither

        asyncio.run(traffic())
        body, _ = Metrics(plane).render()
        text = body.decode()
        without = Metrics(DataPlane(host)).render()[0].decode()

    families = parse(body)
    counts = {name: per_model(families[name]) for name in CACHE_COUNTERS}
    assert counts["nv_cache_num_hits_per_model"] == {("mlp", "1"): 2, ("tree", "1"): 0}
    assert counts["nv_cache_num_misses_per_model"] == {("mlp", "1"): 1, ("tree", "1"): 0}
    for name in CACHE_COUNTERS:
        assert f"# TYPE {name} counter\n" in text
        assert f"{name}_total" not in text
        assert name not in without  # a server without a cache writes none
    assert counts["nv_cache_miss_duration_per_model"][("mlp", "1")] >= 0
    # A cached answer is a success, not an inference (Triton's count).
    assert per_model(families["nv_inference_request_success"])[("mlp", "1")] == 3
    assert per_model(families["nv_inference_count"])[("mlp", "1")] == 1
    assert per_model(families["nv_inference_exec_count"])[("mlp", "1")] == 1
    assert only_value(families["corral_response_cache_entries"]) == 1
    assert only_value(families["corral_response_cache_size_bytes"]) == 1 << 20
    assert 0 < only_value(families["corral_response_cache_bytes"]) < 1 << 20
    assert only_value(families["corral_response_cache_evictions"]) == 0
    assert "corral_response_cache_entries" not in without


def test_counters_carry_triton_names_without_total(repo: Path):
    with Host(repo) as host:
        plane = DataPlane(host)
        asyncio.run(plane.infer("mlp", None, request()))
        text = Metrics(plane).render()[0].decode()

    for name in TRITON_COUNTERS:
        assert f"# TYPE {name} counter\n" in text
        # The failures with Triton's reason label too, one sample per reason, 0 included.
        if name == "nv_inference_request_failure":
            for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER"):
                assert f'\n{name}{{model="mlp",version="1",reason="{reason}"}} 0\n' in text
        else:
            assert f'\n{name}{{model="mlp",version="1"}} ' in text
        assert f"{name}_total" not in text
    assert f"# TYPE {PENDING} gauge\n" in text
    # corral's own counters follow the Prometheus convention instead.
    assert "\ncorral_model_loads_total 1.0\n" in text
    assert "\ncorral_model_evictions_total 0.0\n" in text


def test_budget_is_exposed_and_nothing_is_registered_globally(repo: Path):
    with Host(repo, memory_budget="1GiB") as host:
        plane = DataPlane(host)
        first, second = Metrics(plane), Metrics(plane)  # a global registry would refuse twice
        families = parse(first.render()[0])
        # The process's own families (CPU seconds, the collector's objects) move in between,
        # and so does its count of OS threads: another test's thread may still be exiting.
        again = parse(second.render()[0])
        assert {**corral_only(families), "corral_threads": []} == {
            **corral_only(again),
            "corral_threads": [],
        }
        assert only_value(families["corral_threads"]) >= 1

    assert only_value(families["corral_memory_budget_bytes"]) == 2**30
    assert only_value(families["corral_models_loaded"]) == 0
    assert "nv_inference_request_success" in families  # the family, with no model yet
    assert families["nv_inference_request_success"] == []
    assert prometheus_client.REGISTRY.get_sample_value("corral_models_loaded") is None


@pytest.mark.timeout(60)
def test_render_from_other_threads_while_requests_run(repo: Path):
    with Host(repo) as host:
        plane = DataPlane(host)
        metrics = Metrics(plane)
        stop = threading.Event()
        seen: list[list[float]] = [[] for _ in range(3)]
        latencies: list[list[float]] = [[] for _ in range(3)]

        def scrape(into: list[float], latency: list[float]) -> None:
            while not stop.is_set():
                families = parse(metrics.render()[0])
                into.append(sum(s.value for s in families["nv_inference_request_success"]))
                latency.extend(
                    s.value
                    for s in families["corral_request_duration_seconds"]
                    if s.name.endswith("_count")
                )

        scrapers = [
            threading.Thread(target=scrape, args=(into, latency))
            for into, latency in zip(seen, latencies, strict=True)
        ]
        for thread in scrapers:
            thread.start()

        async def traffic() -> None:
            await asyncio.gather(*(plane.infer("mlp", None, request()) for _ in range(50)))
            await asyncio.gather(*(plane.infer("tree", None, request()) for _ in range(50)))

        try:
            asyncio.run(traffic())
        finally:
            stop.set()
            for thread in scrapers:
                thread.join()
        final = parse(metrics.render()[0])

    assert per_model(final["nv_inference_request_success"]) == {("mlp", "1"): 50, ("tree", "1"): 50}
    for totals in [*seen, *latencies]:
        assert totals, "every scraper rendered at least once"
        assert totals == sorted(totals), "a counter went backwards"
        assert totals[-1] <= 100
    latency = {s.name: s.value for s in final["corral_request_duration_seconds"]}
    assert latency["corral_request_duration_seconds_count"] == 100
    model_counts = {
        s.labels["model"]: s.value
        for s in final["corral_model_request_duration_seconds"]
        if s.name.endswith("_count")
    }
    assert model_counts == {"mlp": 50, "tree": 50}


def test_label_values_are_escaped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    odd = 'a "quoted"\\name\nwith a newline'
    row = ModelStatistics(
        name=odd,
        version="1",
        last_inference=0,
        inference_count=1,
        execution_count=1,
        success=Duration(1, 5_000),
        fail=Duration(),
        queue=Duration(1, 1_000),
        compute_input=Duration(),
        compute_infer=Duration(1, 2_000),
        compute_output=Duration(),
    )
    with Host(tmp_path) as host:
        plane = DataPlane(host)
        monkeypatch.setattr(plane, "statistics_snapshot", lambda queues=None, counted=None: [row])
        families = parse(Metrics(plane).render()[0])

    assert per_model(families["nv_inference_request_duration_us"]) == {(odd, "1"): 5}
    assert per_model(families["nv_inference_compute_infer_duration_us"]) == {(odd, "1"): 2}


def fake_statistics(
    models: int,
) -> tuple[list[ModelStatistics], dict[tuple[str, int], QueueStats]]:
    """``models`` model versions that have answered requests, each with its own figures."""
    rows = []
    queues = {}
    for i in range(models):
        name, version = f"model-{i:05d}", str(1 + i % 2)
        rows.append(
            ModelStatistics(
                name=name,
                version=version,
                last_inference=1_700_000_000_000 + i,
                inference_count=i + 1,
                execution_count=i // 2 + 1,
                success=Duration(i + 1, (i + 1) * 1_000_000),
                fail=Duration(i % 7, (i % 7) * 3_000),
                queue=Duration(i + 1, i * 2_000),
                compute_input=Duration(),
                compute_infer=Duration(i // 2 + 1, i * 5_000),
                compute_output=Duration(),
            )
        )
        queues[(name, int(version))] = QueueStats(
            accepted=i + 1,
            rejected=0,
            expired=0,
            cancelled=0,
            pending=i % 3,
            runs=i // 2 + 1,
            rows=i + 1,
            queue_seconds_sum=i * 2e-6,
            compute_seconds_sum=i * 5e-6,
            batch_rows_buckets=(),
        )
    return rows, queues


# Reading the page back with prometheus_client's parser costs 0.3-0.4 s per 1,000 model versions
# (rendering them, 0.02 s): make test renders 2,000, make soak 10,000.
@pytest.mark.timeout(60)
@pytest.mark.parametrize("models", [2_000, pytest.param(10_000, marks=pytest.mark.soak)])
def test_every_model_version_is_rendered(
    models: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    rows, queues = fake_statistics(models)
    with Host(tmp_path) as host:
        plane = DataPlane(host)
        monkeypatch.setattr(plane, "statistics_snapshot", lambda queues=None, counted=None: rows)
        monkeypatch.setattr(host, "queue_stats", lambda: queues)
        body, _ = Metrics(plane).render()

    families = parse(body)
    expected = {
        "nv_inference_request_success": lambda i: i + 1,
        "nv_inference_request_failure": lambda i: i % 7,
        "nv_inference_count": lambda i: i + 1,
        "nv_inference_exec_count": lambda i: i // 2 + 1,
        "nv_inference_request_duration_us": lambda i: (i + 1) * 1_000 + (i % 7) * 3,
        "nv_inference_queue_duration_us": lambda i: i * 2,
        "nv_inference_compute_infer_duration_us": lambda i: i * 5,
        PENDING: lambda i: i % 3,
    }
    for name, value in expected.items():
        samples = families[name]
        if name == "nv_inference_request_failure":
            # One per Triton reason; rows given without reasons count theirs as OTHER.
            assert len(samples) == 4 * models
            samples = [s for s in samples if s.labels["reason"] == "OTHER"]
        got = per_model(samples)
        assert len(samples) == models, name
        assert got == {(f"model-{i:05d}", str(1 + i % 2)): value(i) for i in range(models)}, name
