"""Redis and the planner go away mid-run; the services live on and no accepted job is lost.

(c) Redis killed (SIGKILL: only its append-only file survives) while jobs run, down 5 s,
started again on the same port and directory: every service process is alive after,
every job that got a 2xx finishes, exact, and new jobs are served.
(d) The planner killed mid-run: jobs keep finishing on the decision in force; a restarted
planner publishes again and both workers apply it.
"""

from __future__ import annotations

import signal
import time

import anyio
import httpx
import pytest
import redis.asyncio as aioredis

from shared import keys
from shared.connection import connect
from shared.control import Decision
from tests.chaos.cluster import Cluster
from tests.chaos.jobs import (
    N_TOKENS,
    PROMPTS,
    SHORT_N,
    SHORT_PROMPTS,
    audit,
    expected_greedy,
    holdings,
    latest_decision,
    submit_all,
    tally,
    wait_acked,
    wait_all_ended,
)
from tests.e2e.conftest import poll

pytestmark = [pytest.mark.chaos, pytest.mark.redis, pytest.mark.anyio]

OUTAGE_S = 5.0


async def _tokens_flowing(r: aioredis.Redis, job_ids: list[str], workers: tuple[str, ...]) -> bool:
    """Every worker has streamed tokens of the run and the run is still going (a worker whose
    share of a burst is short may finish it between two looks: requiring it to be caught
    mid-job made this wait time out now and then)."""
    held = (await holdings(r, job_ids)).values()
    streamed = {h.worker for h in held if h.events >= 3}
    return streamed == set(workers) and any(h.status == "running" for h in held)


async def test_redis_restart_with_aof_mid_run(
    healthy: Cluster, gw: httpx.AsyncClient, r: aioredis.Redis
) -> None:
    c = healthy
    accepted = await submit_all(gw, PROMPTS[:12], max_tokens=N_TOKENS, ignore_eos=True)
    await poll(lambda: _tokens_flowing(r, list(accepted), c.workers), 60, "both workers streaming tokens")
    before = (await latest_decision(r)).version
    await r.aclose()

    down_at = c.redis.stop()
    # A service started while Redis is down waits for it (the planner starts in a second).
    c.signal("planner", signal.SIGKILL)
    c.start("planner")
    during: list[str] = []  # what the gateway answered while Redis was down: "503+retry-after", ...
    async with httpx.AsyncClient(base_url=c.url, timeout=OUTAGE_S + 10) as probe:
        while time.time() < down_at + OUTAGE_S:  # the outage itself: probe the gateway meanwhile
            prompt = SHORT_PROMPTS[len(during) % len(SHORT_PROMPTS)]
            try:
                resp = await probe.post(
                    "/v1/jobs", json={"prompt": prompt, "params": {"max_tokens": SHORT_N, "ignore_eos": True}}
                )
                answer = str(resp.status_code)
                answer += "+retry-after" if "retry-after" in resp.headers else ""
                json_body = resp.headers.get("content-type", "").startswith("application/json")
                answer += "" if json_body else "+not-json"
                during.append(answer)
                if resp.status_code < 300:
                    accepted[resp.json()["id"]] = prompt
            except httpx.TransportError as exc:
                during.append(type(exc).__name__)
            # Pace the probes: the outage lasts OUTAGE_S by design, this is not a wait for a condition.
            await anyio.sleep(max(0.0, min(0.5, down_at + OUTAGE_S - time.time())))
        dead_during = c.dead()
    c.redis.start()
    up_at = time.time()
    r2 = connect(c.redis.url())
    print(f"\n[chaos c] outage_s={up_at - down_at:.1f} dead_during={dead_during} probes={during}")
    try:
        assert not dead_during, f"died during the outage: {dead_during}\n{c.logs_of_dead()}"
        await wait_all_ended(r2, list(accepted), 120, "every accepted job to end after the restart")
        audits = {j: await audit(r2, j) for j in accepted}
        n_of = {j: SHORT_N if p in SHORT_PROMPTS else N_TOKENS for j, p in accepted.items()}
        expected = {j: expected_greedy(c.model_dir, p, n_of[j]) for j, p in accepted.items()}
        t = tally(list(audits.values()), expected)
        last_ms = max(a.final_ms or 0 for a in audits.values())
        dead_after = c.dead()
        print(f"[chaos c] {t} all_ended_s_after_restart={last_ms / 1000 - up_at:.1f} dead_after={dead_after}")
        assert not dead_after, c.logs_of_dead()
        assert t.clean() and t.failed == 0, t
        await wait_acked(r2)

        async def planner_publishing() -> bool:
            return (await latest_decision(r2)).version > before

        await poll(planner_publishing, 30, "the planner started during the outage to publish")
        # New jobs are served after the outage.
        new = await submit_all(gw, SHORT_PROMPTS[:4], max_tokens=SHORT_N, ignore_eos=True)
        await wait_all_ended(r2, list(new), 60, "jobs submitted after the restart")
        t2 = tally(
            [await audit(r2, j) for j in new],
            {j: expected_greedy(c.model_dir, p, SHORT_N) for j, p in new.items()},
        )
        assert t2.clean() and t2.failed == 0, t2
        # While Redis was down, a submit was a JSON 503 that says when to retry (or accepted).
        assert all(a == "503+retry-after" or a.startswith("2") for a in during), during
    finally:
        await r2.aclose()


async def test_planner_killed_mid_run(healthy: Cluster, gw: httpx.AsyncClient, r: aioredis.Redis) -> None:
    c = healthy
    before = await latest_decision(r)
    n_tokens = N_TOKENS
    job_ids = await submit_all(gw, PROMPTS[8:], max_tokens=n_tokens, ignore_eos=True)
    await poll(lambda: _tokens_flowing(r, list(job_ids), c.workers), 60, "both workers streaming tokens")
    c.signal("planner", signal.SIGKILL)
    await wait_all_ended(r, list(job_ids), 90, "every job to end with the planner dead")
    expected = {j: expected_greedy(c.model_dir, p, n_tokens) for j, p in job_ids.items()}
    t = tally([await audit(r, j) for j in job_ids], expected)
    assert set(c.dead()) == {"planner"}, c.logs_of_dead()
    assert t.clean() and t.failed == 0, t

    restarted_at = time.time()
    c.start("planner")

    async def resumed() -> Decision | None:
        latest = await latest_decision(r)
        acks = {_text(k): int(v) for k, v in (await r.hgetall(keys.DECISION_ACKS)).items()}
        if latest.version > before.version and all(acks.get(w, -1) >= latest.version for w in c.workers):
            return latest
        return None

    latest = await poll(resumed, 60, "the restarted planner's decision applied by both workers", every_s=0.1)
    assert isinstance(latest, Decision) and latest.policy == before.policy == "static"
    assert latest.gamma_table == before.gamma_table  # it resumed the policy it ran
    print(
        f"\n[chaos d] {t} decision v{before.version} -> v{latest.version} "
        f"applied {time.time() - restarted_at:.1f}s after the restart"
    )
    new = await submit_all(gw, SHORT_PROMPTS[4:8], max_tokens=SHORT_N, ignore_eos=True)
    await wait_all_ended(r, list(new), 60, "jobs after the planner restart")
    t2 = tally(
        [await audit(r, j) for j in new],
        {j: expected_greedy(c.model_dir, p, SHORT_N) for j, p in new.items()},
    )
    assert t2.clean() and t2.failed == 0, t2
    await wait_acked(r)
    assert not c.dead(), c.logs_of_dead()


def _text(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v
