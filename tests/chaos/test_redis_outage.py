"""Redis goes away under OpenAI clients: a short outage costs them nothing, a long one is a
503 (or an error chunk) with Retry-After and cancels every job behind one.

(c) Redis SIGKILLed (only its append-only file survives) for 5 s, under the gateway's
``--outage-grace`` (15 s here), while 6 streaming and 6 non-streaming completions run on
both workers; the planner is restarted meanwhile, and a submit every 0.5 s probes the
gateway. Every client gets its whole answer, no error, each token once; every job is exact;
every service lives; the probes are answered 503 + Retry-After at once; new jobs are served.
(c30) Redis down 30 s, past the grace period, under 12 long completions (and a worker sent
SIGTERM meanwhile, which drains and exits though Redis is away): every client is answered
503 / an error chunk with Retry-After within the grace period while Redis is still down, and
once it is back every job ends cancelled — the gateway wrote the cancels it remembered — long
before its 2,000 tokens: no worker goes on working for a client that was given an error.
"""

from __future__ import annotations

import signal
import time
import uuid

import anyio
import httpx
import pytest
import redis.asyncio as aioredis

from shared.connection import connect
from shared.schemas import FinishEvent
from tests.chaos.clients import Answer, complete
from tests.chaos.cluster import Cluster
from tests.chaos.jobs import (
    LONG_PROMPTS,
    SHORT_N,
    SHORT_PROMPTS,
    all_running,
    audit,
    expected_greedy,
    greedy_or_reference,
    latest_decision,
    submit_all,
    tally,
    wait_acked,
    wait_all_ended,
)
from tests.e2e.conftest import poll

pytestmark = [pytest.mark.chaos, pytest.mark.redis, pytest.mark.anyio]

OUTAGE_S = 5.0
LONG_OUTAGE_S = 30.0
LONG_JOB_N = 2000  # far more than a job makes in the time it runs here
# (c)'s jobs must still run when Redis is killed: 128 tokens take 0.27 s on the tiny model with
# the fused decode kernel, too quick to catch all 12 running; 1,024 take a few seconds.
OUTAGE_N = 1024


def _clients(prompts: list[str]) -> list[tuple[str, str, bool]]:
    """(Idempotency-Key, prompt, stream): each prompt once streamed, once not."""
    run = uuid.uuid4().hex[:8]
    return [(f"chaos-{run}-{'sn'[not s]}{i}", p, s) for s in (True, False) for i, p in enumerate(prompts)]


async def _probe(probe: httpx.AsyncClient, prompt: str) -> tuple[str, float]:
    """A submit while Redis is down: what it was answered ("503+retry-after") and how fast."""
    t0 = time.monotonic()
    try:
        resp = await probe.post("/v1/jobs", json={"prompt": prompt, "params": {"max_tokens": SHORT_N}})
    except httpx.TransportError as exc:
        return type(exc).__name__, time.monotonic() - t0
    answer = str(resp.status_code)
    answer += "+retry-after" if "retry-after" in resp.headers else ""
    answer += "" if resp.headers.get("content-type", "").startswith("application/json") else "+not-json"
    return answer, time.monotonic() - t0


async def test_redis_outage_under_the_grace_period_costs_clients_nothing(
    healthy: Cluster, gw: httpx.AsyncClient, r: aioredis.Redis
) -> None:
    c = healthy
    assert c.outage_grace_s > OUTAGE_S
    clients = _clients(LONG_PROMPTS)  # OUTAGE_N tokens: the jobs outlast the kill
    job_ids = {key: Answer(key, False).job_id for key, _, _ in clients}
    answers: list[Answer] = []
    during: list[tuple[str, float]] = []  # the probes' answers while Redis was down
    with anyio.fail_after(240):
        async with anyio.create_task_group() as tg:

            async def one(key: str, prompt: str, stream: bool) -> None:
                answers.append(await complete(c.url, key, prompt, OUTAGE_N, stream))

            for key, prompt, stream in clients:
                tg.start_soon(one, key, prompt, stream)
            await poll(lambda: all_running(r, list(job_ids.values()), c.workers), 60, "every job running")
            before = (await latest_decision(r)).version
            await r.aclose()

            down_at = c.redis.stop()
            c.signal("planner", signal.SIGKILL)  # a service started while Redis is down waits for it
            c.start("planner")
            async with httpx.AsyncClient(base_url=c.url, timeout=OUTAGE_S + 10) as probe:
                while time.time() < down_at + OUTAGE_S:  # the outage itself: probe the gateway meanwhile
                    during.append(await _probe(probe, SHORT_PROMPTS[len(during) % len(SHORT_PROMPTS)]))
                    # Pace the probes: the outage lasts OUTAGE_S by design, this is no wait for a condition.
                    await anyio.sleep(max(0.0, min(0.5, down_at + OUTAGE_S - time.time())))
            dead_during = c.dead()
            c.redis.start()
            up_at = time.time()
        answered_s = time.time() - up_at  # every client had its whole answer
    r2 = connect(c.redis.url())
    try:
        assert not dead_during, f"died during the outage: {dead_during}\n{c.logs_of_dead()}"
        await wait_all_ended(r2, list(job_ids.values()), 60, "every job to end")
        audits = {key: await audit(r2, job) for key, job in job_ids.items()}
        prompt_of = {key: prompt for key, prompt, _ in clients}
        # 1,024 greedy tokens meet float ties: each token is checked against the target's logits.
        expected = {
            job_ids[k]: greedy_or_reference(c.model_dir, prompt_of[k], OUTAGE_N, audits[k].token_ids)
            for k in job_ids
        }
        t = tally(list(audits.values()), expected)
        failed = [a for a in answers if a.failed]
        mismatched = [a.key for a in answers if not a.failed and a.text != _final_text(audits[a.key].final)]
        dead_after = c.dead()
        print(
            f"\n[chaos c] outage_s={up_at - down_at:.1f} clients={len(answers)} (streamed "
            f"{sum(a.stream for a in answers)}) failed_clients={len(failed)} text_mismatch={len(mismatched)} "
            f"{t} answered_s_after_restart={answered_s:.1f} probes={[p for p, _ in during]} "
            f"probe_max_s={max(s for _, s in during):.2f} dead_after={dead_after}"
        )
        assert len(answers) == len(clients) and not failed, [a for a in failed]
        assert not mismatched, mismatched  # every token once, none missing, in order
        assert t.clean() and t.failed == 0, t
        assert not dead_after, c.logs_of_dead()
        await wait_acked(r2)
        # While Redis was down, a submit was a JSON 503 that says when to retry, at once.
        assert during and all(p == "503+retry-after" for p, _ in during), during

        async def planner_publishing() -> bool:
            return (await latest_decision(r2)).version > before

        await poll(planner_publishing, 30, "the planner started during the outage to publish")
        new = await submit_all(gw, SHORT_PROMPTS[:4], max_tokens=SHORT_N, ignore_eos=True)
        await wait_all_ended(r2, list(new), 60, "jobs submitted after the restart")
        t2 = tally(
            [await audit(r2, j) for j in new],
            {j: expected_greedy(c.model_dir, p, SHORT_N) for j, p in new.items()},
        )
        assert t2.clean() and t2.failed == 0, t2
    finally:
        await r2.aclose()


async def test_redis_outage_past_the_grace_period_is_a_503_and_cancels_every_job(
    healthy: Cluster, r: aioredis.Redis
) -> None:
    c = healthy
    assert c.outage_grace_s + 5 < LONG_OUTAGE_S
    clients = _clients(SHORT_PROMPTS[:6])
    job_ids = {key: Answer(key, False).job_id for key, _, _ in clients}
    answers: list[Answer] = []
    drained = "wB"
    with anyio.fail_after(LONG_OUTAGE_S + 180):
        async with anyio.create_task_group() as tg:

            async def one(key: str, prompt: str, stream: bool) -> None:
                answers.append(await complete(c.url, key, prompt, LONG_JOB_N, stream))

            for key, prompt, stream in clients:
                tg.start_soon(one, key, prompt, stream)
            await poll(lambda: all_running(r, list(job_ids.values()), c.workers), 60, "every job running")
            await r.aclose()
            down_at = c.redis.stop()
            c.signal(drained, signal.SIGTERM)  # a drain while Redis is away ends too

            seen: dict[str, float] = {}  # when each was first seen (every 0.05 s)

            async def drained_and_answered() -> bool:
                if drained in c.dead():
                    seen.setdefault("exit", time.time())
                if len(answers) == len(clients):
                    seen.setdefault("answered", time.time())
                return len(seen) == 2

            await poll(drained_and_answered, LONG_OUTAGE_S - 3, "every client answered and the worker gone")
            answered_s, exit_s = seen["answered"] - down_at, seen["exit"] - down_at
            assert time.time() < down_at + LONG_OUTAGE_S  # (Redis is still down)
        # Redis stays down for the rest of the outage (by design: no condition to wait for).
        await anyio.sleep(max(0.0, down_at + LONG_OUTAGE_S - time.time()))
        c.redis.start()
        up_at = time.time()
    r2 = connect(c.redis.url())
    try:
        await wait_all_ended(r2, list(job_ids.values()), 90, "every job to end once Redis is back")
        audits = {key: await audit(r2, job) for key, job in job_ids.items()}
        t = tally(list(audits.values()))
        finals = [a.final for a in audits.values()]
        cancelled = [f for f in finals if isinstance(f, FinishEvent) and f.finish_reason == "cancelled"]
        tokens = [f.completion_tokens for f in cancelled]
        ended_s = max((a.final_ms or 0) / 1000 for a in audits.values()) - up_at
        failed = [a for a in answers if a.failed]
        print(
            f"\n[chaos c30] outage_s={up_at - down_at:.1f} grace_s={c.outage_grace_s:g} "
            f"clients={len(answers)} failed_clients={len(failed)} "
            f"(answered {answered_s:.1f}s into the outage: "
            f"{sorted({(a.status, a.error, a.retry_after) for a in answers}, key=str)}) "
            f"{t} cancelled={len(cancelled)}/{len(finals)} tokens_made(max)={max(tokens, default=0)} "
            f"of {LONG_JOB_N} all_ended_s_after_restart={ended_s:.1f} {drained}_exit_s={exit_s:.1f} "
            f"(exit code {c.dead().get(drained)})"
        )
        # Every client was told, with a time to retry, within the grace period (+ its backoff).
        assert len(answers) == len(clients) and answered_s < c.outage_grace_s + 5, answered_s
        for a in answers:
            if a.stream:
                assert a.status == 200 and a.error == "unavailable" and a.done, a
            else:
                assert a.status == 503 and a.error == "unavailable" and a.retry_after, a
        # ... and every job behind them was cancelled once Redis was back, none run to the end.
        assert t.lost == 0 and t.duplicated == 0 and t.double_finals == 0, t
        assert len(cancelled) == len(finals), finals
        assert max(tokens) < LONG_JOB_N
        # The worker sent SIGTERM while Redis was away drained and exited, cleanly.
        assert exit_s <= c.drain_timeout_s + 10 and c.dead() == {drained: 0}, c.logs_of_dead()
    finally:
        await r2.aclose()


def _final_text(final: object) -> str | None:
    return final.text if isinstance(final, FinishEvent) else None
