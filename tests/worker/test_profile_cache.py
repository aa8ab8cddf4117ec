"""The cost profile's cache: keyed by model, drafters, machine, code and shape; used at start
instead of measuring; measured again once the worker has been idle, and written back."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from shared import keys
from shared.profile import CostProfile
from shared.schemas import SamplingParams
from worker.cost_profile import REFRESH, CostProfiler
from worker.engine.api import Engine, EngineRequest
from worker.profile_cache import CODE_DIRS, CODE_FILES, ProfileCache, code_digest, profile_key
from worker.profiling import ProfileSettings

pytestmark = pytest.mark.anyio
M = "tiny"
FAST = ProfileSettings(max_batch=2, reps=1)


class Clock:
    """A clock the test moves (no sleeping)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _cache(tmp_path: Path, engine: Engine, model_dir: Path, shape: ProfileSettings = FAST) -> ProfileCache:
    return ProfileCache(tmp_path / "profiles", profile_key(engine, model_dir, [], shape))


def test_the_key_changes_with_the_model_the_shape_and_the_code(
    tmp_path: Path, engine: Engine, model_dir: Path
) -> None:
    key = profile_key(engine, model_dir, [], FAST)
    assert profile_key(engine, model_dir, [], FAST) == key  # stable
    assert profile_key(engine, model_dir, [], ProfileSettings(max_batch=4, reps=1)) != key
    assert profile_key(engine, model_dir, [], ProfileSettings(max_batch=2, reps=1, enabled=False)) == key
    copy = tmp_path / model_dir.name
    shutil.copytree(model_dir, copy)
    assert profile_key(engine, copy, [], FAST) == key  # same name, config and weights
    weights = next(copy.glob("*.safetensors"))
    os.utime(weights, ns=(1, 1))  # re-exported: another modification time
    assert profile_key(engine, copy, [], FAST) != key
    served = engine.weights
    engine.weights = "Q4_1"  # the same files served at another precision
    assert profile_key(engine, model_dir, [], FAST) != key
    engine.weights = served
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    first = profile_key(engine, gguf, [], FAST)
    os.utime(gguf, ns=(1, 1))
    assert profile_key(engine, gguf, [], FAST) != first  # a .gguf file as the model: its own weights
    # The measuring code: a copy of it digests the same until one file changes.
    root = tmp_path / "src"
    for rel in CODE_FILES:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"# {rel}\n")
    for d in CODE_DIRS:
        (root / d).mkdir(parents=True, exist_ok=True)
        (root / d / "mod.py").write_text("x = 1\n")
    before = code_digest(root)
    assert code_digest(root) == before
    (root / "worker/profiling.py").write_text("# changed\n")
    assert code_digest(root) != before
    after = code_digest(root)
    (root / "worker/engine/mod.py").write_text("x = 2\n")
    assert code_digest(root) != after


def test_store_and_load(tmp_path: Path, engine: Engine, model_dir: Path) -> None:
    cache = _cache(tmp_path, engine, model_dir)
    assert cache.load() is None
    profile = CostProfile(model=M, batches=[1, 2], rows=[1, 2], target_s=[[0.01, 0.012], [0.015, 0.02]])
    cache.store(profile)
    got = cache.load()
    assert got is not None and got.model_dump() == profile.model_dump()
    other = _cache(tmp_path, engine, model_dir, ProfileSettings(max_batch=4, reps=1))
    assert other.load() is None and other.path != cache.path
    # A file whose key is not ours (the same name, another key inside) is not used.
    other.path.parent.mkdir(parents=True, exist_ok=True)
    other.path.write_text(cache.path.read_text())
    assert other.load() is None
    cache.path.write_text("{not json")
    assert cache.load() is None


async def _published(r: aioredis.Redis) -> CostProfile | None:
    raw = await r.get(keys.cost_profile(M))
    return None if raw is None else CostProfile.loads(raw)


async def test_a_cached_profile_is_used_at_start_and_refreshed_when_idle(
    r: aioredis.Redis, tmp_path: Path, engine: Engine, model_dir: Path
) -> None:
    cache = _cache(tmp_path, engine, model_dir)
    first = CostProfiler(r, engine, M, "w1", FAST, cache=cache)
    assert await first.measure() is None
    measured = first.profile
    assert measured is not None and measured.source == "startup" and not first.refresh_due
    stored = cache.load()
    assert stored is not None and stored.measured_at == measured.measured_at

    clock = Clock()
    second = CostProfiler(r, engine, M, "w2", FAST, cache=cache, refresh_idle_s=10.0, clock=clock)
    assert await second.measure() is None
    loaded = second.profile
    assert loaded is not None and loaded.source == "cache (startup)" and loaded.worker_id == "w2"
    assert loaded.measured_at == measured.measured_at and loaded.target_s == measured.target_s
    await second.publish()
    published = await _published(r)
    assert published is not None and published.worker_id == "w2"

    clock.now += 9.0  # not idle long enough: nothing measured
    assert await second.when_idle() is None and second.profile is loaded
    second.note(engine.step().stats)  # an idle step does not count as work
    clock.now += 1.0
    assert await second.when_idle() is None
    refreshed = second.profile
    assert refreshed is not loaded and refreshed is not None and refreshed.source == REFRESH
    assert refreshed.measured_at > loaded.measured_at and not second.refresh_due
    again = cache.load()
    assert again is not None and again.measured_at == refreshed.measured_at  # written back
    clock.now += 100.0
    assert await second.when_idle() is None and second.profile is refreshed  # once per start


class _Arriving:
    """An engine proxy that receives a real request at its first step."""

    def __init__(self, engine: Engine, request: EngineRequest) -> None:
        self.engine, self.request, self.sent = engine, request, False

    def step(self):  # type: ignore[no-untyped-def]
        if not self.sent:
            self.sent = True
            self.engine.add_request(self.request)
        return self.engine.step()

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self.engine, name)


async def test_a_job_stops_the_refresh_and_restarts_the_idle_clock(
    r: aioredis.Redis, tmp_path: Path, engine: Engine, model_dir: Path
) -> None:
    cache = _cache(tmp_path, engine, model_dir)
    assert await CostProfiler(r, engine, M, "w1", FAST, cache=cache).measure() is None
    clock = Clock()
    job = EngineRequest("job", [5, 6, 7], SamplingParams(max_tokens=3, ignore_eos=True))
    proxy = _Arriving(engine, job)
    profiler = CostProfiler(r, proxy, M, "w2", FAST, cache=cache, refresh_idle_s=5.0, clock=clock)  # type: ignore[arg-type]
    assert await profiler.measure() is None and profiler.refresh_due
    clock.now += 5.0
    mixed = await profiler.when_idle()
    assert mixed is not None and {o.request_id for o in mixed.outputs} == {"job"}  # handed back
    assert profiler.refresh_due and not profiler.stale and profiler.busy_at == clock.now
    assert profiler.profile is not None and profiler.profile.source == "cache (startup)"
    assert await profiler.when_idle() is None  # the idle clock started again


class _AdmittedDuring:
    """An engine proxy where a job is admitted while its third profiling step runs."""

    def __init__(self, engine: Engine, request: EngineRequest) -> None:
        self.engine, self.request, self.steps, self.admitted = engine, request, 0, False

    def step(self):  # type: ignore[no-untyped-def]
        self.steps += 1
        result = self.engine.step()
        if self.steps == 3:
            self.engine.add_request(self.request)
            self.admitted = True
        return result

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self.engine, name)


async def test_an_admitted_job_stops_the_refresh_before_the_next_step(
    r: aioredis.Redis, tmp_path: Path, engine: Engine, model_dir: Path
) -> None:
    cache = _cache(tmp_path, engine, model_dir)
    assert await CostProfiler(r, engine, M, "w1", FAST, cache=cache).measure() is None
    clock = Clock()
    job = EngineRequest("job", [5, 6, 7], SamplingParams(max_tokens=3, ignore_eos=True))
    proxy = _AdmittedDuring(engine, job)
    profiler = CostProfiler(
        r, proxy, M, "w2", FAST, cache=cache, refresh_idle_s=5.0, clock=clock,  # type: ignore[arg-type]
        waiting=lambda: proxy.admitted,
    )  # fmt: skip
    assert await profiler.measure() is None
    clock.now += 5.0
    assert await profiler.when_idle() is None  # stopped before its 4th step: nothing ran beside the job
    assert proxy.steps == 3 and profiler.refresh_due and profiler.busy_at == clock.now
    tokens: list[int] = []
    for _ in range(20):  # the worker's next steps: the job alone, the synthetic requests cancelled
        result = engine.step()
        for o in result.outputs:
            if o.request_id == "job":
                tokens += o.new_token_ids
            else:
                assert o.finish_reason == "cancelled"
        if not engine.has_unfinished():
            break
    assert len(tokens) == 3
