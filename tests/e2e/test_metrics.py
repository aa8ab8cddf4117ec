"""See it run: a short speculative run of the embedded default (the bundled target and its
drafters, gateway + planner + worker in one process on memory://), then every metric the
issue names is on the gateway's /metrics with sensible values, request ids go through, the
planner's decision log line names what it decided, and ``nightjar top --once`` shows it."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import anyio
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import create_app
from gateway.settings import GatewaySettings
from nightjar import top
from nightjar.runner import http_server, run_services
from planner.service import PlannerService
from planner.settings import PlannerSettings
from shared import codec, keys
from shared.connection import connect, reset_fake_server
from shared.control import Decision
from tests.e2e.conftest import free_port, poll
from tests.vllm_dashboards import manifest
from worker.service import WorkerService
from worker.settings import WorkerSettings

pytestmark = pytest.mark.anyio

MODELS = Path(__file__).resolve().parents[2] / "models"
TARGET, DRAFTERS = MODELS / "nj-target", [MODELS / "nj-draft-prose", MODELS / "nj-draft-code"]
WORKER = "metrics-w1"

Samples = dict[str, list[tuple[dict[str, str], float]]]


def parse(text: str) -> Samples:
    out: Samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def total(samples: Samples, name: str, **labels: str) -> float:
    got = [v for lb, v in samples.get(name, []) if all(lb.get(k) == x for k, x in labels.items())]
    assert got, f"{name}{labels} is not exported"
    return sum(got)


async def scrape(gw: httpx.AsyncClient) -> Samples:
    resp = await gw.get("/metrics")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    return parse(resp.text)


async def admin(gw: httpx.AsyncClient, params: dict[str, object]) -> None:
    resp = await gw.post(
        "/admin/policy", json={"policy": "static", "params": params}, headers={"Authorization": "Bearer t"}
    )
    assert resp.status_code == 202


@pytest.mark.skipif(not (TARGET / "config.json").is_file(), reason="bundled model missing")
async def test_metrics_request_ids_and_top_on_a_speculative_run(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    reset_fake_server()
    port = free_port()
    worker = WorkerService(
        WorkerSettings(
            model_dir=str(TARGET), drafters=[str(d) for d in DRAFTERS], worker_id=WORKER, block_ms=200
        )
    )
    planner = PlannerService(PlannerSettings(policy="static", block_ms=200, params={"gamma": 3}))
    server = http_server(create_app(GatewaySettings(admin_token="t")), "127.0.0.1", port, "warning")
    r = connect("memory://")
    with anyio.fail_after(240):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run_services, [worker.run, planner.run], server)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as gw:
                await poll(lambda: _ready(gw), 60, "the worker to register")
                await _exercise(gw, r)
                await _offload_and_back(gw)
                samples = await scrape(gw)
                _check_gateway(samples)
                _check_worker(samples)
                _check_planner(samples)
                _check_vllm(samples)
                hedge = await _hedge_weights(gw)
                snap = top.render(await top.snapshot(r), "memory://")
            server.should_exit = True
    _check_logs(caplog)
    _check_top(snap)
    assert set(hedge) >= {"ngram"} and sum(hedge.values()) == pytest.approx(1.0, abs=0.01)
    assert "hedge     drafter weights" in snap and "policy bandit" in snap


async def _ready(gw: httpx.AsyncClient) -> bool:
    try:
        return bool((await gw.get("/health")).json().get("workers"))
    except httpx.TransportError:
        return False


async def _exercise(gw: httpx.AsyncClient, r: object) -> None:
    # A given request id comes back, a missing one is made; both reach the job.
    resp = await gw.post(
        "/v1/completions",
        json={"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0},
        headers={"X-Request-Id": "req-given-1"},
    )
    assert resp.status_code == 200 and resp.headers["x-request-id"] == "req-given-1"
    made = (await gw.get("/v1/models")).headers["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{24}", made)
    bad = await gw.get("/health", headers={"X-Request-Id": "has spaces"})
    assert bad.headers["x-request-id"] != "has spaces"

    async def one(i: int) -> None:
        body = {"prompt": f"The story of number {i} begins", "max_tokens": 32, "temperature": 0}
        if i % 2:
            body["stream"] = True
        got = await gw.post("/v1/completions", json=body, headers={"X-Request-Id": f"req-{i}"})
        assert got.status_code == 200 and got.headers["x-request-id"] == f"req-{i}"

    async with anyio.create_task_group() as tg:
        for i in range(6):
            tg.start_soon(one, i)
    # Two choices (two jobs followed together): both counted.
    two = await gw.post("/v1/completions", json={"prompt": "Two roads", "max_tokens": 8, "n": 2, "seed": 3})
    assert two.status_code == 200 and len(two.json()["choices"]) == 2
    # The job API, read by polling (no event stream followed): counted once all the same.
    job = (await gw.post("/v1/jobs", json={"prompt": "def main():", "params": {"max_tokens": 8}})).json()

    async def done() -> bool:
        info = (await gw.get(f"/v1/jobs/{job['id']}")).json()
        return info["status"] == "finished"

    await poll(done, 60, "the polled job to finish")
    assert (await gw.get("/nope")).status_code == 404


async def _offload_and_back(gw: httpx.AsyncClient) -> None:
    """Offload the drafters, then bring them back: both moves show in the metrics."""
    moves: list[tuple[dict[str, object], str]] = [({"offload": True}, "offload"), ({"gamma": 3}, "reload")]
    for params, event in moves:
        await admin(gw, params)

        async def moved(ev: str = event) -> bool:
            await gw.post("/v1/completions", json={"prompt": "a b c", "max_tokens": 4})
            s = await scrape(gw)
            return any(lb.get("event") == ev and v > 0 for lb, v in s.get("nightjar:memory_events_total", []))

        await poll(moved, 60, f"a drafter {event}", every_s=0.2)


async def _hedge_weights(gw: httpx.AsyncClient) -> dict[str, float]:
    """Swap to the bandit policy (NormalHedge over the drafters): its weights are exported."""
    resp = await gw.post("/admin/policy", json={"policy": "bandit"}, headers={"Authorization": "Bearer t"})
    assert resp.status_code == 202

    async def weights() -> dict[str, float]:
        await gw.post("/v1/completions", json={"prompt": "one two one two one", "max_tokens": 8})
        s = await scrape(gw)
        active = (
            total(s, "nightjar:planner_active_policy", policy="bandit")
            if any(lb.get("policy") == "bandit" for lb, _ in s.get("nightjar:planner_active_policy", []))
            else 0
        )
        got = {lb["drafter"]: v for lb, v in s.get("nightjar:planner_drafter_weight", [])}
        return got if active == 1 and got else {}

    got = await poll(weights, 60, "the bandit policy's drafter weights", every_s=0.2)
    assert isinstance(got, dict)
    return got


def _check_gateway(s: Samples) -> None:
    assert total(s, "nightjar:http_requests_total", route="/v1/completions", status="200") >= 7
    assert total(s, "nightjar:http_requests_total", route="unmatched", status="404") >= 1
    mw = {"worker": WORKER, "model": "nj-target"}
    for hist in (
        "time_to_first_token_seconds",
        "inter_token_latency_seconds",
        "e2e_request_latency_seconds",
        "request_queue_time_seconds",
    ):
        n = total(s, f"nightjar:{hist}_count", **mw)
        assert n >= 10, hist
        assert 0 < total(s, f"nightjar:{hist}_sum", **mw) / n < 30, hist
    assert total(s, "nightjar:inter_token_latency_seconds_count", **mw) > 100  # per token
    finished = total(s, "nightjar:request_success_total", **mw)  # "length", or "stop" at an EOS
    assert finished >= 12 and total(s, "nightjar:request_success_total", finished_reason="length", **mw) >= 1
    assert total(s, "nightjar:prompt_tokens_total", **mw) > 8 * 3
    assert 100 < total(s, "nightjar:generation_tokens_total", **mw) <= 24 + 6 * 32 + 2 * 8 + 8 + 4 * finished


def _check_worker(s: Samples) -> None:
    w = {"worker": WORKER, "model": "nj-target"}
    for gauge in ("num_requests_running", "num_requests_waiting", "spec_decode_gamma", "draft_resident"):
        assert total(s, f"nightjar:{gauge}", **w) >= 0
    assert 0 <= total(s, "nightjar:kv_cache_usage_perc", **w) <= 1
    hits = total(s, "nightjar:prefix_cache_hits_total", **w)
    assert total(s, "nightjar:prefix_cache_queries_total", **w) >= hits >= 0
    assert total(s, "nightjar:num_preemptions_total", **w) >= 0
    drafts = total(s, "nightjar:spec_decode_num_drafts_total", **w)
    proposed = total(s, "nightjar:spec_decode_num_draft_tokens_total", **w)
    accepted = total(s, "nightjar:spec_decode_num_accepted_tokens_total", **w)
    assert drafts > 0 and proposed >= drafts and 0 < accepted <= proposed
    per_pos = {lb["position"]: v for lb, v in s["nightjar:spec_decode_num_accepted_tokens_per_pos_total"]}
    assert sum(per_pos.values()) == accepted and per_pos["0"] >= per_pos.get("1", 0)
    assert total(s, "nightjar:step_time_seconds_count", **w) > 10
    assert total(s, "nightjar:spec_decode_gamma_steps_total", gamma="3", **w) > 0
    for event in ("offload", "reload"):
        assert total(s, "nightjar:memory_events_total", event=event, **w) >= 1
        assert total(s, "nightjar:memory_event_duration_seconds_count", event=event, **w) >= 1
    assert total(s, "nightjar:decision_version", **w) >= 1


def _check_planner(s: Samples) -> None:
    assert total(s, "nightjar:planner_decisions_published_total", policy="static") >= 3
    assert total(s, "nightjar:planner_active_policy", policy="static") == 1
    assert total(s, "nightjar:planner_gamma", bucket="+Inf") == 3
    assert total(s, "nightjar:planner_offload") == 0
    assert total(s, "nightjar:planner_decision_version") >= 3
    assert 0 <= total(s, "nightjar:planner_decision_age_seconds") < 30
    assert total(s, "nightjar:planner_telemetry_observed_total", worker=WORKER) > 10
    assert total(s, "nightjar:planner_fallback_steps_total", worker=WORKER) >= 0


def _check_vllm(s: Samples) -> None:
    """vLLM's dashboards (deploy/grafana/vllm-queries.json) resolve against /metrics: every
    family they query is there with the labels they select and group by (job and instance are
    Prometheus'), and their selections match our series."""
    spec = manifest()
    skip = set(spec["not_exported"]) | set(spec["prometheus_metrics"])
    outside = set(spec["prometheus_labels"])
    for dash in spec["dashboards"]:
        for name, labels in dash["metrics"].items():
            if name in skip:
                continue
            series = [lb for lb, _ in s.get(name, [])]
            assert series, (dash["title"], f"{name} is not on /metrics")
            for label in set(labels) - outside:
                assert any(label in lb for lb in series), (dash["title"], name, label)
            for label, values in dash.get("label_values", {}).get(name, {}).items():
                assert set(values) <= {lb.get(label) for lb in series}, (name, label, values)
        assert not set(spec["not_exported"]) & set(s), "named as absent but exported"
    vllm = {"model_name": "nj-target", "engine": WORKER}
    # the dashboards' model_name variable is the served model; traffic shows in every row
    assert total(s, "vllm:request_success_total", **vllm) >= 12
    assert total(s, "vllm:e2e_request_latency_seconds_count", **vllm) >= 12
    assert total(s, "vllm:inter_token_latency_seconds_count", **vllm) > 50
    assert total(s, "vllm:generation_tokens_total", **vllm) > 100
    accepted = total(s, "vllm:spec_decode_num_accepted_tokens_total", **vllm)
    assert 0 < accepted <= total(s, "vllm:spec_decode_num_draft_tokens_total", **vllm)
    per_pos = total(s, "vllm:spec_decode_num_accepted_tokens_per_pos_total", **vllm)
    assert per_pos == accepted
    # the same numbers as Nightjar's own families
    w = {"worker": WORKER, "model": "nj-target"}
    assert accepted == total(s, "nightjar:spec_decode_num_accepted_tokens_total", **w)
    generated = total(s, "nightjar:engine_generated_tokens_total", **w)
    assert total(s, "vllm:generation_tokens_total", **vllm) == generated
    assert total(s, "http_requests_total", handler="/v1/completions", status="2xx") >= 7
    assert not [lb for lb, _ in s["http_requests_total"] if lb["handler"].startswith(("/metrics", "/health"))]


def _check_logs(caplog: pytest.LogCaptureFixture) -> None:
    finished = [r for r in caplog.records if r.name == "worker.jobs" and "finished" in r.getMessage()]
    assert len(finished) >= 8
    given = [r for r in finished if getattr(r, "request_id", None) == "req-given-1"]
    assert len(given) == 1
    line = given[0].getMessage()
    for part in ("24 completion tokens", "ttft", "latency", "length", f"worker={WORKER}", "attempts=1"):
        assert part in line, (part, line)
    started = [r for r in caplog.records if "started (attempt" in r.getMessage()]
    assert any(getattr(r, "request_id", None) == "req-given-1" for r in started)
    applied = [r.getMessage() for r in caplog.records if r.getMessage().startswith("applied decision")]
    assert any("γ" in m and "drafter" in m and "offload" in m for m in applied), applied


def _check_top(text: str) -> None:
    assert WORKER in text and "nj-target" in text and "decision v" in text
    assert re.search(r"\d+(-\d+)?: \d+/(\d\.\d|-)", text), text  # γ decided / run per bucket
    assert "drafter shares" in text and re.search(r"nj-draft-\w+ \d+%", text), text


async def test_decision_is_readable_after_run() -> None:
    """The latest decision a snapshot reads is the codec's (guards the keys top relies on)."""
    reset_fake_server()
    r = connect("memory://")
    d = Decision(version=4, policy="static", gamma_table=[(4, 2), (1 << 30, 0)])
    await r.set(keys.DECISION_LATEST, codec.encode(d))
    snap = await top.snapshot(r)
    assert snap.decision == d and snap.workers == []
    text = top.render(snap)
    assert "1-4:γ2" in text and "≥5:γ0" in text
    await r.aclose()
