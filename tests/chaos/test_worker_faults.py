"""A worker killed or paused under load: every job ends once, no token position twice.

(a) SIGKILL one of two workers while 20 jobs run: all finish, exact, and the dead worker's
orphans resume and finish within ``--claim-idle`` + 5 s of the kill (the workers are given
``--claim-idle 3`` alone: renewals and sweeps follow from it).
(b) SIGSTOP one worker past ``--claim-idle`` (its jobs are taken over), then SIGCONT: the
resumed worker writes nothing more for the jobs it lost.
"""

from __future__ import annotations

import signal
import time
from collections import Counter

import httpx
import pytest
import redis.asyncio as aioredis

from shared import keys
from tests.chaos.cluster import Cluster
from tests.chaos.jobs import (
    LONG_N,
    LONG_PROMPTS,
    N_TOKENS,
    PROMPTS,
    Audit,
    audit,
    busy_on,
    expected_greedy,
    holdings,
    submit_all,
    tally,
    wait_all_ended,
    worker_info,
)
from tests.e2e.conftest import poll

pytestmark = [pytest.mark.chaos, pytest.mark.redis, pytest.mark.anyio]


async def test_worker_sigkill_under_load(healthy: Cluster, gw: httpx.AsyncClient, r: aioredis.Redis) -> None:
    c = healthy
    n_tokens, prompts = N_TOKENS, PROMPTS
    t0 = time.time()
    job_ids = await submit_all(gw, prompts, max_tokens=n_tokens, ignore_eos=True)

    async def a_worker_busy() -> str | None:
        # The victim is whichever worker first streams at least 3 of the jobs.
        for w in c.workers:
            if len(await busy_on(r, list(job_ids), w)) >= 3:
                return w
        return None

    try:
        victim = await poll(a_worker_busy, 60, "a worker to be running 3 jobs", every_s=0.02)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{await _state(c, r, list(job_ids))}") from None
    assert isinstance(victim, str)
    killed_at = c.signal(victim, signal.SIGKILL)
    orphans = [
        j
        for j, h in (await holdings(r, list(job_ids))).items()
        if h.worker == victim and h.status == "running"
    ]
    try:
        await wait_all_ended(r, list(job_ids), 90, "every job to end after the kill")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{await _state(c, r, list(job_ids))}") from None
    t_end = time.time()
    audits = {j: await audit(r, j) for j in job_ids}
    expected = {j: expected_greedy(c.model_dir, p, n_tokens) for j, p in job_ids.items()}
    print(
        f"\n[chaos a timing] kill after {killed_at - t0:.1f}s, all ended {t_end - killed_at:.1f}s after, "
        f"audit+reference {time.time() - t_end:.1f}s"
    )
    t = tally(list(audits.values()), expected)
    orphan_finish = [(audits[j].final_ms or 0) / 1000 - killed_at for j in orphans]
    # Resumed: the orphan's start event written by the worker that took it over.
    orphan_resume = [_resumed_ms(audits[j], victim) / 1000 - killed_at for j in orphans]
    print(
        f"\n[chaos a] {t} orphans={len(orphans)} claim_idle_s={c.claim_idle_s:g} "
        f"orphan_resume_s(max)={max(orphan_resume, default=0):.2f} "
        f"orphan_finish_s(max)={max(orphan_finish, default=0):.2f}"
    )
    assert t.clean() and t.failed == 0, (t, _bad(audits))
    assert orphans and all(audits[j].workers[-1] != victim for j in orphans)
    # Renewals and sweeps derive from --claim-idle alone (worker/settings.py claim_timing).
    assert max(orphan_resume) <= c.claim_idle_s + 5, orphan_resume
    assert max(orphan_finish) <= c.claim_idle_s + 5, orphan_finish
    assert c.dead() == {victim: -signal.SIGKILL}


async def test_worker_sigstop_past_claim_idle_then_sigcont(
    healthy: Cluster, gw: httpx.AsyncClient, r: aioredis.Redis
) -> None:
    c = healthy
    n_tokens, prompts = LONG_N, LONG_PROMPTS  # long enough that the paused worker still has work left
    job_ids = await submit_all(gw, prompts, max_tokens=n_tokens, ignore_eos=True)

    async def spread() -> dict[str, list[str]] | None:
        # Every job started; the victim is whichever worker streams more of them (at least 2).
        busy = {w: await busy_on(r, list(job_ids), w) for w in c.workers}
        if sum(map(len, busy.values())) < len(job_ids) or max(map(len, busy.values())) < 2:
            return None
        return busy

    busy = await poll(spread, 60, "every job to be streaming", every_s=0.05)
    assert isinstance(busy, dict)
    victim = max(c.workers, key=lambda w: len(busy[w]))
    other = next(w for w in c.workers if w != victim)
    held = busy[victim]
    stopped_at = c.signal(victim, signal.SIGSTOP)
    try:

        async def taken_over() -> bool:
            now = await holdings(r, held)
            return all(h.worker == other for h in now.values())

        await poll(taken_over, c.claim_idle_s + 30, f"{other} to take over {victim}'s jobs", every_s=0.1)
        took_s = time.time() - stopped_at
    finally:
        log_at = c.log_size(victim)
        resumed_at = c.signal(victim, signal.SIGCONT)
    await wait_all_ended(r, list(job_ids), 120, "every job to end after the resume")
    ended_s = time.time() - resumed_at

    async def victim_settled() -> bool:
        # The resumed worker has noticed (a heartbeat after the resume) and holds nothing more.
        raw = await r.hget(keys.WORKERS, victim)
        info = worker_info(raw)
        return info is not None and info.ts > resumed_at + 0.5 and info.running == 0

    await poll(victim_settled, 60, f"{victim} to settle after SIGCONT", every_s=0.1)
    audits = {j: await audit(r, j) for j in job_ids}
    expected = {j: expected_greedy(c.model_dir, p, n_tokens) for j, p in job_ids.items()}
    t = tally(list(audits.values()), expected)
    lost_lines = c.log_since(victim, log_at).count("was taken over by another worker")
    print(
        f"\n[chaos b] {t} held_by_victim={len(held)} takeover_s={took_s:.2f} all_ended_s_after_resume="
        f"{ended_s:.1f} victim_logged_lost={lost_lines}"
    )
    assert t.clean() and t.failed == 0, (t, _bad(audits))
    assert not c.dead(), c.logs_of_dead()


def _resumed_ms(a: Audit, victim: str) -> int:
    """When another worker than ``victim`` started the job (its start event's stream time)."""
    return next(ms for (worker, _), ms in zip(a.starts, a.start_ms, strict=True) if worker != victim)


def _bad(audits: dict[str, Audit]) -> list[tuple[str, int, int, list[tuple[str, int]]]]:
    return [
        (j, a.duplicated, a.finals, a.starts)
        for j, a in audits.items()
        if a.duplicated or a.finals != 1 or a.gaps
    ]


async def _state(c: Cluster, r: aioredis.Redis, job_ids: list[str]) -> str:
    """What a failed wait reports: who holds the jobs, each worker's heartbeat, log tails."""
    held = Counter((h.worker, h.status) for h in (await holdings(r, job_ids)).values())
    beats = {w: worker_info(await r.hget(keys.WORKERS, w)) for w in c.workers}
    tails = "\n".join(f"--- {w} log:\n{c.log_tail(w, 2500)}" for w in c.workers)
    return f"holdings (worker, status) -> jobs: {dict(held)}\nheartbeats: {beats}\n{tails}"
