"""The chat page's files and its planner data route, without a browser: the page is served at
/ and /ui with a strict Content-Security-Policy and references nothing outside the gateway;
/ui/api/top is what ``nightjar top`` shows, as JSON, guarded like /v1 when keys are set."""

from __future__ import annotations

import re
import time

import pytest
import redis.asyncio as aioredis

from shared import codec, keys
from shared.control import ALL_BATCHES, Decision, Telemetry
from tests.gateway.conftest import gateway

pytestmark = pytest.mark.anyio


async def test_the_page_and_its_files_come_from_the_gateway_alone(r: aioredis.Redis) -> None:
    async with gateway(r) as gw:
        pages = [await gw.get(p) for p in ("/", "/ui")]
        js = await gw.get("/ui/chat.js")
        css = await gw.get("/ui/style.css")
        missing = await gw.get("/ui/secrets.txt")
    for resp in pages:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/html")
        assert "default-src 'none'" in resp.headers["content-security-policy"]
        assert '<script src="/ui/chat.js"' in resp.text
    assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
    for resp in (*pages, js, css):
        assert not re.search(r"https?://", resp.text), "the page must fetch nothing from elsewhere"
    assert "include_spec: true" in js.text  # it asks for the speculation facts
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


async def test_top_json_is_the_planners_decision_and_the_workers_steps(r: aioredis.Redis) -> None:
    now = time.time()
    decision = Decision(version=4, policy="static", gamma_table=[(4, 3), (ALL_BATCHES, 1)], drafter="ngram")
    await r.set(keys.DECISION_LATEST, codec.encode(decision))
    for i, batch in enumerate((2, 2, 8)):
        t = Telemetry(
            worker_id="fake", ts=now + i, batch_size=batch, num_tokens=3 * batch, gamma=3 if batch < 4 else 1,
            drafter="ngram", proposed=6, accepted=3, decision_version=4, total_blocks=10, free_blocks=5,
        )  # fmt: skip
        await r.xadd(keys.TELEMETRY_STREAM, codec.entry(t))
    async with gateway(r) as gw:  # registers worker "fake"
        top = (await gw.get("/ui/api/top")).json()
    assert top["decision"]["version"] == 4 and top["decision"]["drafter"] == "ngram"
    assert [(b["batch"], b["gamma"]) for b in top["decision"]["buckets"]] == [("1-4", 3), ("≥5", 1)]
    (w,) = top["workers"]
    assert w["worker_id"] == "fake" and w["acceptance"] == pytest.approx(0.5)
    assert [(g["decided"], g["run"]) for g in w["gamma_run"]] == [(3, 3.0), (1, 1.0)]
    assert w["kv_used"] == pytest.approx(0.5) and w["drafter_shares"] == {"ngram": 1.0}
    assert "decision v4 (static)" in top["text"]


async def test_with_api_keys_the_data_needs_a_key_and_the_page_does_not(r: aioredis.Redis) -> None:
    async with gateway(r, api_keys=("k1",)) as gw:
        page = await gw.get("/")
        bare = await gw.get("/ui/api/top")
        keyed = await gw.get("/ui/api/top", headers={"Authorization": "Bearer k1"})
    assert page.status_code == 200
    assert bare.status_code == 401 and bare.json()["error"]["code"] == "unauthorized"
    assert keyed.status_code == 200 and keyed.json()["workers"]
