"""deploy/grafana/corral.json: every metric a panel queries is one corral exposes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from corral import Host
from corral.protocol.dataplane import DataPlane
from corral.server.bodies import BodyBudget
from corral.server.observe.metrics import Metrics
from corral.testing import build_linear
from tests.helpers import add_model

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "deploy" / "grafana" / "corral.json"
# PromQL's words that may stand before "(" or inside an expression, never metric names.
PROMQL = {"sum", "rate", "by", "topk", "histogram_quantile", "le", "model", "reason", "e6"}


def queried_metrics(expression: str) -> set[str]:
    without_labels = re.sub(r"\{[^}]*\}", "{}", expression)
    without_ranges = re.sub(r"\[[^\]]*\]", "[]", without_labels)
    names = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*(?=\{)", without_ranges))
    return names - PROMQL


def family_of(name: str) -> str:
    return re.sub(r"_(bucket|sum|count|total)$", "", name)


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    repo = tmp_path_factory.mktemp("grafana")
    add_model(repo, "m", build_linear(seed=1))
    with Host(repo, memory_budget="1MB") as host:
        host.load("m")
        host.count_request("m", 1, 1_000_000, ok=True)
        body, _ = Metrics(DataPlane(host), BodyBudget(1 << 20)).render()
    names = set()
    for family in text_string_to_metric_families(body.decode()):
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
    return names


@pytest.mark.timeout(60)
def test_every_metric_the_dashboard_queries_is_exposed_or_documented(scraped: set[str]):
    dashboard = json.loads(DASHBOARD.read_text())
    operations = (ROOT / "docs" / "operations.md").read_text()
    queried: set[str] = set()
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            queried |= queried_metrics(target["expr"])
    assert len(queried) >= 15
    missing = sorted(
        name for name in queried if name not in scraped and f"`{family_of(name)}`" not in operations
    )
    assert missing == []
    # What Linux always exposes is checked against the scrape itself, not the docs alone.
    assert "corral_request_duration_seconds_bucket" in queried & scraped
    assert "nv_inference_request_success" in queried & scraped


def test_the_dashboard_is_well_formed():
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert dashboard["uid"] == "corral-overview"
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}"
        for target in panel["targets"]:
            assert '{job=~"$job", instance=~"$instance"' in target["expr"], target["expr"]


def test_the_metric_finder_finds_names_and_skips_promql():
    expression = (
        "histogram_quantile(0.99, sum by (le) (rate(corral_request_duration_seconds_bucket"
        '{job=~"$job"}[$__rate_interval]))) / sum(corral_memory_budget_bytes{a="b"})'
    )
    assert queried_metrics(expression) == {
        "corral_request_duration_seconds_bucket",
        "corral_memory_budget_bytes",
    }
