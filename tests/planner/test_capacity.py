"""The capacity estimate: workers per model from a cost profile, the queue and an SLO.

The profile here: a decoding step of b sequences takes 10 ms + 1 ms·b. Under a TPOT target
of 50 ms and workers of --max-jobs 16, a worker runs 16 at 26 ms a step (615 tokens/s); a
job of 100 tokens then holds a slot S = 2.6 s. At ρ = 0.8, λ jobs/s need λ·2.6 / (16·0.8)
workers: 12.8 jobs/s need 2.6, so 3.
"""

from __future__ import annotations

import time

import pytest
import redis.asyncio as aioredis

from planner.capacity import SLO, CapacityPlanner, Hysteresis, Load, best_batch, required
from planner.capacity_io import CapacityReader
from planner.service import PlannerService
from planner.settings import PlannerSettings
from shared import codec, keys
from shared.control import Decision, Telemetry, WorkerInfo
from shared.profile import CostProfile
from shared.streams import ensure_group

MODEL = "m1"
BATCHES = [1, 2, 4, 8, 16, 32]
SLO_ = SLO(ttft_s=2.0, tpot_s=0.05, utilization=0.8)


def _profile() -> CostProfile:
    return CostProfile(model=MODEL, batches=BATCHES, rows=[1], target_s=[[0.01 + 0.001 * b] for b in BATCHES])


def test_the_batch_is_the_largest_within_the_tpot_target() -> None:
    p = _profile()
    assert best_batch(p, SLO_, max_jobs=16) == 16  # capped by the workers' slots
    assert best_batch(p, SLO_) == 32  # 42 ms: within 50
    assert best_batch(p, SLO(tpot_s=0.015)) == 5  # 15 ms at 5 sequences
    assert best_batch(p, SLO(tpot_s=0.001)) == 1  # nothing fits: one sequence at a time


def test_a_rate_that_needs_three_workers_asks_for_three() -> None:
    need = required(
        _profile(), Load(arrival_per_s=12.8, tokens_per_job=100, running=0, waiting=0, max_jobs=16), SLO_
    )
    assert need.batch == 16 and need.step_s == pytest.approx(0.026)
    assert need.job_s == pytest.approx(2.6) and need.worker_tokens_per_s == pytest.approx(615.4, rel=1e-3)
    assert need.workers == pytest.approx(2.6)
    assert Hysteresis(min_workers=1).update(need.workers, 0.0) == 3
    half = required(_profile(), Load(6.4, 100, 0, 0, 16), SLO_)
    assert Hysteresis().update(half.workers, 0.0) == 2  # 1.3


def test_a_backlog_asks_for_the_workers_that_start_it_within_the_ttft_target() -> None:
    # 20 jobs waiting, S = 2.6 s, 16 slots a worker: starting them within 2 s takes 1.625 more.
    idle = required(_profile(), Load(0.0, 100, running=0, waiting=20, max_jobs=16), SLO_)
    assert idle.workers == pytest.approx(20 * 2.6 / (16 * 2.0))
    busy = required(_profile(), Load(12.8, 100, running=0, waiting=20, max_jobs=16), SLO_)
    assert busy.workers == pytest.approx(2.6 + 1.625)
    # What runs now fills slots whatever the averages say: 40 running on 16 slots a worker.
    assert required(_profile(), Load(0.0, 100, running=40, waiting=0, max_jobs=16), SLO_).workers == 2.5


def test_hysteresis_up_at_once_down_after_the_window_and_no_flapping() -> None:
    h = Hysteresis(scale_down_window_s=60, tolerance=0.1, min_workers=1)
    assert h.update(2.6, 0) == 3
    # Noise around 3 never moves it: 3.2 is within 10 % of 3, dips are held by the window.
    got = [h.update(need, t) for t, need in enumerate([2.9, 3.2, 2.7, 3.25, 2.95, 3.1] * 5, start=1)]
    assert set(got) == {3}
    assert h.update(4.5, 31) == 5  # a real rise: at once
    # A fall: held at the window's highest for 60 s, then down.
    assert [h.update(1.2, t) for t in (32, 60, 90)] == [5, 5, 5]
    assert h.update(1.2, 92) == 2
    assert Hysteresis(min_workers=2, max_workers=4).update(0.0, 0) == 2
    assert Hysteresis(min_workers=0).update(0.0, 0) == 0  # scale to zero when allowed
    assert Hysteresis(max_workers=4).update(9.0, 0) == 4


async def _register(r: aioredis.Redis, worker: str, max_jobs: int = 16) -> None:
    info = WorkerInfo(worker_id=worker, model=MODEL, max_jobs=max_jobs)
    await r.hset(keys.WORKERS, worker, codec.encode(info))


async def _simulate(
    r: aioredis.Redis, cap: CapacityPlanner, seconds: int, jobs_per_5s: int, t0: float
) -> int:
    """``seconds`` of traffic on the embedded Redis: jobs added to the model's stream, the same
    number finishing, 100 tokens each reported by the worker's telemetry; one refresh a second."""
    reader = CapacityReader(r, cap)
    desired = 0
    for s in range(seconds):
        n = jobs_per_5s // 5 + (1 if s % 5 < jobs_per_5s % 5 else 0)
        for _ in range(n):
            await r.xadd(keys.jobs_stream(MODEL), {b"m": b"x"})
            await r.xadd(keys.finished_stream(MODEL), {b"j": b"x"})
            cap.observe(Telemetry(worker_id="w1", num_tokens=100, batch_size=1))
        got = await reader.refresh(now=t0 + s)
        desired = got.get(MODEL, 0)
    return desired


@pytest.mark.anyio
async def test_synthetic_telemetry_through_the_reader_asks_for_three(r: aioredis.Redis) -> None:
    await r.set(keys.cost_profile(MODEL), _profile().dumps())
    await _register(r, "w1")
    cap = CapacityPlanner(SLO_, window_s=10, scale_down_window_s=30)
    assert await _simulate(r, cap, 60, jobs_per_5s=64, t0=1000.0) == 3  # 12.8 jobs/s
    c = cap.models[MODEL]
    assert c.load is not None and c.load.arrival_per_s == pytest.approx(12.8, rel=0.05)
    assert c.load.tokens_per_job == pytest.approx(100, rel=0.05)
    # The traffic halves: still 3 inside the scale-down window, 2 after it.
    assert await _simulate(r, cap, 20, jobs_per_5s=32, t0=1060.0) == 3
    assert await _simulate(r, cap, 60, jobs_per_5s=32, t0=1080.0) == 2


@pytest.mark.anyio
async def test_the_planner_publishes_the_count_in_its_decision_and_metrics(r: aioredis.Redis) -> None:
    await r.set(keys.cost_profile(MODEL), _profile().dumps())
    await _register(r, "w1")
    p = PlannerService(PlannerSettings(tpot_target_s=0.05, min_workers=1), redis=r)
    first = await p.start()
    assert first.desired_workers == {}
    await ensure_group(r, keys.jobs_stream(MODEL), keys.JOBS_GROUP)
    for _ in range(41):  # 41 jobs waiting, nothing running
        await r.xadd(keys.jobs_stream(MODEL), {b"m": b"x"})
    now = time.time()
    # No job ended yet: 256 tokens a job by default, S = 256 · 26 ms = 6.656 s; starting the
    # 41 waiting within 2 s on 16 slots a worker: 41 · 6.656 / (16 · 2) = 8.5, so 9.
    assert await p.plan_capacity(now) == {MODEL: 9}
    latest = codec.decode_as(await r.get(keys.DECISION_LATEST), Decision)
    assert latest.desired_workers == {MODEL: 9} and latest.version == first.version + 1
    assert f'nightjar:planner_desired_workers{{model="{MODEL}"}} 9.0' in p.metrics.render().decode()
    assert await p.plan_capacity(now + 1) == {MODEL: 9}
    assert codec.decode_as(await r.get(keys.DECISION_LATEST), Decision).version == latest.version  # unchanged
