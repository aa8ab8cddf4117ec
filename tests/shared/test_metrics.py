"""Metric registries, the process view, the metrics HTTP server, the dashboard's queries,
the Prometheus config, and the log formats."""

from __future__ import annotations

import io
import json
import logging
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gateway.metrics import GatewayMetrics
from planner.metrics import PlannerMetrics, drafter_weights
from planner.policies import registry
from shared import keys, logs
from shared import metrics as m
from shared.control import Decision, MemoryEvent, StepStats, Telemetry
from worker.metrics import WorkerMetrics

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "nightjar.json"


def exported() -> dict[str, set[str]]:
    """Every sample name the three services export, with its label names."""
    out: dict[str, set[str]] = {}
    for metric_set in (GatewayMetrics(), WorkerMetrics("m", "w"), PlannerMetrics()):
        for collector in list(metric_set.registry._collector_to_names):  # every family, even unused
            for fam in collector.describe():  # type: ignore[attr-defined]
                labels = set(getattr(collector, "_labelnames", ()))
                suffixes = {
                    "counter": ("_total",),
                    "histogram": ("_bucket", "_count", "_sum"),
                    "gauge": ("",),
                }[fam.type]
                for suffix in suffixes:
                    out[fam.name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
    return out


def test_every_name_is_prefixed_and_the_issue_names_exist() -> None:
    names = exported()
    assert all(n.startswith("nightjar:") for n in names)
    issue = [
        "http_requests_total", "time_to_first_token_seconds_bucket", "inter_token_latency_seconds_bucket",
        "e2e_request_latency_seconds_bucket", "request_queue_time_seconds_bucket", "prompt_tokens_total",
        "generation_tokens_total", "request_success_total", "num_requests_running", "num_requests_waiting",
        "kv_cache_usage_perc", "prefix_cache_queries_total", "prefix_cache_hits_total",
        "num_preemptions_total",
        "spec_decode_num_drafts_total", "spec_decode_num_draft_tokens_total",
        "spec_decode_num_accepted_tokens_total", "spec_decode_num_accepted_tokens_per_pos_total",
        "step_time_seconds_bucket", "spec_decode_gamma", "draft_resident", "memory_events_total",
        "memory_event_duration_seconds_bucket", "planner_decisions_published_total", "planner_active_policy",
        "planner_gamma", "planner_drafter_weight", "planner_fallback_steps_total",
        "planner_decision_age_seconds",
    ]  # fmt: skip
    missing = [n for n in issue if f"nightjar:{n}" not in names]
    assert not missing
    assert {"model", "worker"} <= names["nightjar:time_to_first_token_seconds_bucket"]
    assert {"model", "worker", "drafter", "position"} <= names[
        "nightjar:spec_decode_num_accepted_tokens_per_pos_total"
    ]
    assert "finished_reason" in names["nightjar:request_success_total"]


def _queries(dash: dict[str, Any]) -> list[tuple[str, str, str]]:
    out = []
    for p in dash["panels"]:
        for t in p.get("targets", []):
            out.append((p["title"], t["expr"], t.get("legendFormat", "")))
    return out


def test_the_dashboard_parses_and_every_query_names_exported_metrics() -> None:
    dash = json.loads(DASHBOARD.read_text())
    names = exported()
    queries = _queries(dash)
    assert len(queries) >= 25 and dash["uid"] == "nightjar"
    for title, expr, legend in queries:
        used = re.findall(r"nightjar:[A-Za-z0-9_:]+", expr)
        assert used, (title, expr)
        unknown = [u for u in used if u not in names]
        assert not unknown, (title, unknown)
        labels = set().union(*(names[u] for u in used))
        for group in re.findall(r"by \(([^)]*)\)", expr):
            for label in (x.strip() for x in group.split(",")):
                assert label in labels, (title, label)
        for label in re.findall(r"\{\{(\w+)\}\}", legend):
            assert label in labels, (title, label)
        assert expr.count("(") == expr.count(")"), (title, expr)
    titles = " ".join(p["title"] for p in dash["panels"]).lower()
    for topic in ("throughput", "first token", "inter-token", "end-to-end", "queue", "kv", "acceptance",
                  "γ", "drafter", "offload", "decision versions"):  # fmt: skip
        assert topic in titles, topic
    var = dash["templating"]["list"][0]
    assert re.findall(r"nightjar:[A-Za-z0-9_:]+", var["definition"])[0] in names


def test_grafana_provisioning_and_prometheus_config() -> None:
    ds = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/prometheus.yml").read_text())
    uid = ds["datasources"][0]["uid"]
    dash = json.loads(DASHBOARD.read_text())
    assert all(p["datasource"]["uid"] == uid for p in dash["panels"] if "datasource" in p)
    prov = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/nightjar.yml").read_text())
    assert prov["providers"][0]["options"]["path"]
    prom = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    jobs = {j["job_name"] for j in prom["scrape_configs"]}
    assert jobs == {"gateway", "planner", "worker"}


def test_the_process_view_merges_instances_and_serves_http() -> None:
    a, b = WorkerMetrics("m", "w-a"), WorkerMetrics("m", "w-b")
    stats = StepStats(batch_size=2, num_tokens=5, gamma=2, drafter="ngram", proposed=4, accepted=3,
                      num_drafts=2, accepted_per_pos=[2, 1], total_blocks=10, free_blocks=4, running=2,
                      memory_events=[MemoryEvent(kind="offload", seconds=0.01)])  # fmt: skip
    a.observe_step(stats, 3, False)
    b.observe_step(stats, 3, True)
    text = m.render_process().decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    kv = fams["nightjar:kv_cache_usage_perc"]
    assert {s.labels["worker"]: s.value for s in kv.samples if s.labels["worker"] in ("w-a", "w-b")} == {
        "w-a": pytest.approx(0.6),
        "w-b": pytest.approx(0.6),
    }
    assert text.count("# TYPE nightjar:kv_cache_usage_perc gauge") == 1  # one family, merged
    pos = [s for s in fams["nightjar:spec_decode_num_accepted_tokens_per_pos"].samples
           if s.labels["worker"] == "w-a"]  # fmt: skip
    assert sorted((s.labels["position"], s.value) for s in pos) == [("0", 2.0), ("1", 1.0)]
    server = a.serve_http(0)
    assert server is not None
    try:
        got = httpx.get(f"http://127.0.0.1:{server.server_port}/metrics", timeout=10)
        assert got.status_code == 200 and 'worker="w-b"' in got.text
    finally:
        server.shutdown()
    assert a.serve_http(None) is None


@pytest.mark.anyio
async def test_planner_metrics_and_status(r: Any) -> None:
    pm = PlannerMetrics()
    policy = registry.create("hedge")
    pm.on_publish(Decision(version=1, policy="hedge", gamma_table=[(4, 3), (1 << 30, 1)], drafter="ngram"))
    pm.on_publish(Decision(version=2, policy="static", gamma_table=[(1 << 30, 2)], offload=True))
    pm.observe_telemetry(Telemetry(worker_id="w1", fallback=True))
    text = pm.render().decode()
    assert 'nightjar:planner_gamma{bucket="+Inf"} 2.0' in text and 'bucket="4"' not in text
    assert 'nightjar:planner_active_policy{policy="hedge"} 0.0' in text
    assert 'nightjar:planner_active_policy{policy="static"} 1.0' in text
    assert 'nightjar:planner_drafter{drafter="ngram"} 0.0' in text and "nightjar:planner_offload 1.0" in text
    assert 'nightjar:planner_fallback_steps_total{worker="w1"} 1.0' in text
    await pm.write_status(r, "hedge", policy)
    status = json.loads(await r.get(keys.PLANNER_STATUS))
    assert status["policy"] == "hedge" and status["weights"] == drafter_weights(policy)
    assert drafter_weights(object()) == {}


def _record(msg: str, **extra: Any) -> logging.LogRecord:
    rec = logging.LogRecord("nightjar.test", logging.INFO, __file__, 1, msg, (), None)
    for k, v in extra.items():
        setattr(rec, k, v)
    return rec


def test_log_formats_carry_request_ids() -> None:
    token = logs.REQUEST_ID.set("rid-ctx")
    try:
        line = json.loads(logs.JsonFormatter().format(_record("hello", job_id="j1")))
        plain = logs.PlainFormatter().format(_record("hello"))
    finally:
        logs.REQUEST_ID.reset(token)
    assert line["msg"] == "hello" and line["request_id"] == "rid-ctx" and line["job_id"] == "j1"
    assert line["level"] == "info" and line["logger"] == "nightjar.test" and "ts" in line
    assert plain.endswith("hello [rid-ctx]")
    explicit = json.loads(logs.JsonFormatter().format(_record("x", request_id="rid-job")))
    assert explicit["request_id"] == "rid-job"
    assert logs.PlainFormatter().format(_record("job j request rid-job", request_id="rid-job")).endswith(
        "rid-job"
    )  # named once, not twice
    assert logs.accept_request_id("ok-1") == "ok-1"
    assert logs.accept_request_id("bad id") != "bad id" and logs.accept_request_id(None)
    assert logs.accept_request_id("x" * 129) != "x" * 129


def test_configure_json_writes_one_object_a_line(monkeypatch: pytest.MonkeyPatch) -> None:
    buf = io.StringIO()
    monkeypatch.setattr("sys.stderr", buf)
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        logs.configure("info", "json")
        logging.getLogger("nightjar.x").info("one %d", 1, extra={"worker": "w1"})
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        logs._uvicorn_follows("plain")
    got = json.loads(buf.getvalue().strip().splitlines()[-1])
    assert got["msg"] == "one 1" and got["worker"] == "w1"
    with pytest.raises(ValueError):
        logs.configure("info", "xml")  # type: ignore[arg-type]


def test_cli_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    from nightjar import commands
    from nightjar.cli import build_parser
    from nightjar.options import BUNDLED_MODEL

    for name in ("NIGHTJAR_METRICS_PORT", "NIGHTJAR_METRICS_HOST", "NIGHTJAR_LOG_FORMAT"):
        monkeypatch.delenv(name, raising=False)
    model = ["--model", str(BUNDLED_MODEL)]
    args = build_parser().parse_args(["--log-format", "json", "worker", "--metrics-port", "9100", *model])
    s = commands.worker_config(args, True)
    assert args.log_format == "json" and s.metrics_port == 9100 and s.metrics_host == "127.0.0.1"
    args = build_parser().parse_args(["planner", "--metrics-port", "0", "--metrics-host", "0.0.0.0"])
    p = commands.planner_config(args, True)
    assert p.metrics_port == 0 and p.metrics_host == "0.0.0.0" and "log_format" not in vars(args)
    assert commands.worker_config(build_parser().parse_args(["worker", *model]), True).metrics_port is None


@pytest.mark.anyio
async def test_a_planner_serves_metrics_on_its_port(r: Any) -> None:
    import anyio

    from planner.service import PlannerService
    from planner.settings import PlannerSettings

    planner = PlannerService(PlannerSettings(policy="static", metrics_port=0, block_ms=50), redis=r)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(planner.run)
            while planner.metrics.http_server is None or planner.metrics.last is None:
                await anyio.sleep(0.02)
            port = planner.metrics.http_server.server_port
            async with httpx.AsyncClient() as client:
                got = await client.get(f"http://127.0.0.1:{port}/metrics")
            tg.cancel_scope.cancel()
    assert got.status_code == 200
    assert 'nightjar:planner_active_policy{policy="' in got.text
    assert "nightjar:planner_decision_version 1.0" in got.text


def test_the_monitoring_profile_scrapes_every_service() -> None:
    root = DEPLOY.parent
    compose = yaml.safe_load((root / "compose.yaml").read_text())
    services = compose["services"]
    for name in ("prometheus", "grafana"):
        assert services[name]["profiles"] == ["monitoring"], name
        for volume in services[name]["volumes"]:
            assert (root / volume.split(":")[0]).exists(), volume
    for name in ("worker", "planner"):  # they serve /metrics on the port Prometheus scrapes
        env = services[name]["environment"]
        assert env["NIGHTJAR_METRICS_HOST"] == "0.0.0.0"
        port = int(env["NIGHTJAR_METRICS_PORT"])
        prom = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
        job = next(j for j in prom["scrape_configs"] if j["job_name"] == name)
        targets = [t for c in job.get("static_configs", []) for t in c["targets"]]
        targets += [f"{n}:{c['port']}" for c in job.get("dns_sd_configs", []) for n in c["names"]]
        assert targets == [f"{name}:{port}"], (name, targets)
    gateway_port = services["gateway"]["ports"][0].split(":")[-1]
    assert "gateway:" + gateway_port in str(prom["scrape_configs"])


@pytest.mark.anyio
async def test_a_planner_serves_its_probes_beside_its_metrics(r: Any) -> None:
    import anyio

    from planner.service import PlannerService
    from planner.settings import PlannerSettings

    planner = PlannerService(PlannerSettings(metrics_port=0, block_ms=50), redis=r)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(planner.run)
            while planner.metrics.http_server is None or planner.metrics.last is None:
                await anyio.sleep(0.02)
            port = planner.metrics.http_server.server_port
            async with httpx.AsyncClient() as client:
                ready = await client.get(f"http://127.0.0.1:{port}/health")
                live = await client.get(f"http://127.0.0.1:{port}/health/live")
            tg.cancel_scope.cancel()
    assert ready.status_code == live.status_code == 200
    assert ready.json()["policy"] == planner.settings.policy and ready.json()["version"] >= 1
    planner._decided_at -= 3600  # a decide loop stuck for an hour
    assert planner.health("/health/live")[0] == 503
