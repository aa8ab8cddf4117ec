"""vLLM's Grafana dashboards against Nightjar's metrics, without traffic: every family their
queries name (deploy/grafana/vllm-queries.json) is declared with the labels they use, and
the PromQL reader finds every query's metrics and labels. tests/e2e/test_metrics.py checks
the same names on a running gateway + worker's /metrics after traffic."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.metrics import ApiMetrics
from shared.metrics import MetricSet
from tests.vllm_dashboards import VLLM_DIR, manifest, queries, used
from worker.vllm_metrics import VllmMetrics

SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}


def declared(*sets: MetricSet) -> dict[str, set[str]]:
    """Every sample name the metric sets export, with its label names."""
    out: dict[str, set[str]] = {}
    for metric_set in sets:
        for collector in list(metric_set.registry._collector_to_names):
            labels = set(getattr(collector, "_labelnames", ()))
            for fam in collector.describe():  # type: ignore[attr-defined]
                for suffix in SUFFIXES[fam.type]:
                    out[fam.name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
    return out


def test_every_family_the_dashboards_query_is_declared_with_their_labels() -> None:
    spec = manifest()
    ours = declared(VllmMetrics("m", "w"), ApiMetrics())
    skip = set(spec["not_exported"]) | set(spec["prometheus_metrics"])
    outside = set(spec["prometheus_labels"])
    assert len(spec["dashboards"]) == 3
    for dash in spec["dashboards"]:
        for name, labels in dash["metrics"].items():
            if name in skip:
                continue
            assert name in ours, (dash["title"], name)
            assert set(labels) - outside <= ours[name], (dash["title"], name, set(labels) - ours[name])
    # what is left out is named, with a reason, and queried somewhere
    queried = {n for d in spec["dashboards"] for n in d["metrics"]}
    assert set(spec["not_exported"]) <= queried and all(spec["not_exported"].values())


def test_vllm_labels_are_model_name_and_engine() -> None:
    ours = declared(VllmMetrics("m", "w"))
    assert ours and all(n.startswith("vllm:") for n in ours)
    assert all({"model_name", "engine"} <= labels for labels in ours.values())


def test_the_promql_reader_finds_metrics_labels_and_variables() -> None:
    dash: dict[str, Any] = {
        "panels": [
            {"targets": [{"expr": 'sum by (le) (rate(a_bucket{job=~"$job", x="1"}[5m]))'}]},
            {"type": "row", "panels": [{"targets": [{"expr": 'b_total{y!="2"} / on () group_left () c'}]}]},
        ],
        "templating": {
            "list": [
                {"type": "query", "query": {"query": 'label_values(d{job=~"$job"}, engine)'}},
                {"type": "custom", "query": "1, 2"},
            ]
        },
    }
    got = used(queries(dash))
    assert got == {"a_bucket": {"le", "job", "x"}, "b_total": {"y"}, "d": {"job", "engine"}}


FETCHED = [d for d in manifest()["dashboards"] if (VLLM_DIR / d["file"]).is_file()]


@pytest.mark.parametrize("dash", manifest()["dashboards"], ids=lambda d: d["file"])
def test_a_fetched_vllm_dashboard_queries_what_the_manifest_says(dash: dict[str, Any]) -> None:
    path = VLLM_DIR / dash["file"]
    if not path.is_file():
        pytest.skip(
            f"{dash['file']} not fetched (deploy/grafana/vllm/README.md says how); the manifest stands in"
        )
    got = used(queries(json.loads(path.read_text())))
    assert set(got) == set(dash["metrics"]), set(got) ^ set(dash["metrics"])
    for name, labels in dash["metrics"].items():
        assert set(labels) <= got[name], (name, set(labels) - got[name])
