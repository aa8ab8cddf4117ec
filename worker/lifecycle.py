"""What a stop (SIGTERM: ``WorkerService.request_stop``) means in each phase of a worker's life.

- Starting — measuring the cost profile (a minute on SmolLM2), waiting for Redis,
  registering: nothing is held yet, so a stop ends the start at once (the profile before its
  next engine step) and the worker returns without registering.
- Serving: it drains. No new jobs; the registry says ``draining``; running jobs get
  ``timeout_s`` to finish; the rest are aborted and handed back (status queued, the start
  not counted, the entry made idle so any worker's XAUTOCLAIM takes it at once).
- Either way with Redis down: each Redis step of the drain waits a bounded time
  (``DRAIN_BEAT_S``, ``DRAIN_REDIS_S``); jobs not handed back stay pending under this
  worker and another takes them over ``--claim-idle`` after Redis is back, continuing from
  the output written (at least once, never twice). So a stop always ends the process.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from functools import partial

import anyio

from shared.loops import retry_redis
from worker.engine.api import Engine
from worker.leases import Leases
from worker.outbox import Outbox
from worker.running import RunningJobs

log = logging.getLogger(__name__)

DRAIN_BEAT_S = 1.0  # a drain's "draining" heartbeat waits for Redis this long at most
DRAIN_REDIS_S = 5.0  # and its flush + hand-back after the drain timeout this long


async def start_up(
    stop: anyio.Event, stop_work: Callable[[], None], phases: Iterable[Callable[[], Awaitable[object]]]
) -> bool:
    """Run the start ``phases`` in order; False as soon as ``stop`` is set: the phase under
    way is cancelled, after ``stop_work()`` (thread-safe) told work in a thread to end."""
    async with anyio.create_task_group() as tg:

        async def stop_early() -> None:
            await stop.wait()
            stop_work()  # e.g. the profiling thread ends its pass within a step
            tg.cancel_scope.cancel()

        tg.start_soon(stop_early)
        for phase in phases:
            if stop.is_set():  # (a call that never suspends is not cancelled)
                break
            await phase()
        tg.cancel_scope.cancel()
    return not stop.is_set()


async def drain(
    running: RunningJobs,
    engine: Engine,
    outbox: Outbox,
    leases: Leases,
    heartbeat: Callable[[], Awaitable[None]],
    *,
    worker_id: str,
    timeout_s: float,
    claim_idle_s: float,
) -> None:
    """Let the running jobs finish within ``timeout_s``, then hand the rest back."""
    log.info("worker %s draining %d jobs (up to %.0fs)", worker_id, len(running), timeout_s)
    with anyio.move_on_after(DRAIN_BEAT_S):  # tell the gateways (Redis may be down: go on)
        await retry_redis("heartbeat", heartbeat)
    with anyio.move_on_after(timeout_s):
        while len(running):
            await running.ended.wait()
    left = list(running)
    for run in left:
        engine.abort_request(run.job_id)
        run.let_go()
    handed = 0
    with anyio.move_on_after(DRAIN_REDIS_S) as bounded:
        await outbox.flush()  # what is in hand reaches Redis first
        idle_ms = int(claim_idle_s * 1000) + 1
        for run in left:
            if running.retire(run.job_id) is not None:
                back = partial(leases.hand_back, run.job_id, run.lease, run.entry_id, idle_ms)
                await retry_redis("hand-back", back)
                handed += 1
    if bounded.cancelled_caught:
        log.warning(
            "worker %s: Redis unreachable while draining; %d of %d running jobs not handed back "
            "(another worker takes them over once Redis is back)",
            worker_id, len(left) - handed, len(left),
        )  # fmt: skip
    elif left:
        log.info("worker %s handed %d running jobs back", worker_id, len(left))
