"""The planner goes away mid-run; the services live on and no accepted job is lost.
(Redis going away: tests/chaos/test_redis_outage.py.)

(d) The planner killed as a run starts: jobs keep finishing on the decision in force; a
restarted planner publishes again and both workers apply it.
"""

from __future__ import annotations

import signal
import time

import httpx
import pytest
import redis.asyncio as aioredis

from shared import keys
from shared.control import Decision
from tests.chaos.cluster import Cluster
from tests.chaos.jobs import (
    N_TOKENS,
    PROMPTS,
    SHORT_N,
    SHORT_PROMPTS,
    audit,
    expected_greedy,
    latest_decision,
    submit_all,
    tally,
    wait_acked,
    wait_all_ended,
)
from tests.e2e.conftest import poll

pytestmark = [pytest.mark.chaos, pytest.mark.redis, pytest.mark.anyio]


async def test_planner_killed_mid_run(healthy: Cluster, gw: httpx.AsyncClient, r: aioredis.Redis) -> None:
    c = healthy
    before = await latest_decision(r)
    n_tokens = N_TOKENS
    job_ids = await submit_all(gw, PROMPTS[8:], max_tokens=n_tokens, ignore_eos=True)
    # Killed as soon as the jobs are accepted, so it is dead for the whole run. (Waiting for
    # both workers to be caught streaming first timed out in CI: 48-token jobs on the tiny
    # model end within a poll or two, and an ended run is never caught "running".)
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
