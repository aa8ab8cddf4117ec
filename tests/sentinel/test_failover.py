"""Sentinel for real: the master killed mid-load, the services follow the promoted replica.

One master, one replica, three sentinels (quorum 2, ``down-after-milliseconds`` 1000). While
jobs stream and a client keeps submitting, the master is SIGKILLed; the sentinels promote the
replica, every service (gateway, planner, worker: ``redis+sentinel://``) reconnects to it, and
every accepted job ends once, exactly, with no token sent twice to a client that reconnects
its stream. Printed: the failover time (kill → the sentinels name the new master) and the
service gap (kill → the first job write on the new master).
"""

from __future__ import annotations

import time

import anyio
import httpx
import pytest
import redis.asyncio as aioredis

from tests.chaos import names
from tests.chaos.cluster import Cluster
from tests.chaos.jobs import (
    audit,
    greedy_oracles,
    holdings,
    submit_all,
    tally,
    wait_acked,
    wait_all_ended,
)
from tests.cluster.failover_load import Followed, Submitter, first_write_after, follow
from tests.cluster.servers import SentinelSet, wait_until
from tests.e2e.conftest import poll

pytestmark = [pytest.mark.cluster, pytest.mark.anyio]

N = 512  # tokens of a streamed job: still running when first looked at (32 could all end
# between two looks on a fast machine with the fused kernel, and the wait then never ended)
SHORT_N = 4


async def test_master_killed_mid_load_services_follow_the_new_master(
    healthy: Cluster, gw: httpx.AsyncClient, r: aioredis.Redis, sentinel_set: SentinelSet
) -> None:
    c = healthy
    master = sentinel_set.master_port()
    assert master is not None and sentinel_set.role(master) == "master"
    (replica,) = [p for p in sentinel_set.data if p != master]
    prompts = [f"Sentinel stream {i} goes on" for i in range(6)]
    streamed = await submit_all(gw, prompts, max_tokens=N, ignore_eos=True)
    submitter = Submitter(gw, "Submitted through a Sentinel failover", SHORT_N)
    followed: dict[str, Followed] = {}

    async def follow_one(job_id: str) -> None:
        followed[job_id] = await follow(gw, job_id)

    async def tokens_flowing() -> bool:
        held = (await holdings(r, list(streamed))).values()
        return sum(h.events >= 3 for h in held) >= 2 and any(h.status == "running" for h in held)

    stop = anyio.Event()
    with anyio.fail_after(180):
        async with anyio.create_task_group() as tg:
            for job_id in streamed:
                tg.start_soon(follow_one, job_id)
            tg.start_soon(submitter.run, stop)
            await poll(tokens_flowing, 60, "jobs streaming tokens")
            killed_at = sentinel_set.data[master].kill()
            await anyio.to_thread.run_sync(
                lambda: wait_until(
                    lambda: sentinel_set.master_port() == replica, 30, "the sentinels' failover"
                )
            )
            failover_s = time.time() - killed_at
            accepted_before = len(submitter.accepted)

            async def served_after() -> bool:
                return len(submitter.accepted) >= accepted_before + 3

            await poll(served_after, 60, "submits accepted on the new master", every_s=0.1)
            stop.set()
    assert sentinel_set.role(replica) == "master"
    accepted = {**streamed, **submitter.accepted}
    await wait_all_ended(r, list(accepted), 90, "every accepted job after the failover")
    gap_s = await first_write_after(r, [names.job_events(j) for j in accepted], killed_at)
    n_of = {j: N if j in streamed else SHORT_N for j in accepted}
    audits = [await audit(r, j) for j in accepted]
    expected = greedy_oracles(c.model_dir, accepted, n_of, audits)  # long: argmax up to a float tie
    t = tally(audits, expected)
    print(
        f"\n[sentinel failover] master {master} killed; sentinels promoted {replica} "
        f"after {failover_s:.1f}s; "
        f"first job write on it {gap_s:.1f}s after the kill; {t}; submits {len(submitter.accepted)} "
        f"(tries max {max(submitter.tries)}, refusals {sorted(set(submitter.refusals))} "
        f"x{len(submitter.refusals)}); stream reconnects {sum(f.reconnects for f in followed.values())}"
    )
    assert t.clean() and t.failed == 0, t
    assert not c.dead(), c.logs_of_dead()
    assert all(f.finished and f.duplicated == 0 for f in followed.values()), followed
    assert {j: [f.tokens[i] for i in sorted(f.tokens)] for j, f in followed.items()} == {
        j: expected[j] for j in streamed
    }
    assert submitter.gave_up == 0
    assert all(a == "503+retry-after+json" or not a[0].isdigit() for a in submitter.refusals), (
        submitter.refusals
    )
    await wait_acked(r)
