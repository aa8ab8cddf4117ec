"""The model-free engine of the control-plane benchmark: the contract, at a profile's pace."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
import redis.asyncio as aioredis

from shared import codec, jobs, keys
from shared.schemas import FinishEvent, JobRequest, SamplingParams, TokenEvent
from worker.engine.api import EngineRequest
from worker.engine.synthetic import SyntheticEngine, linear_profile
from worker.engine_factory import create_engine
from worker.prompts import PromptEncoder
from worker.service import WorkerService
from worker.settings import WorkerSettings


def _req(rid: str, n: int) -> EngineRequest:
    return EngineRequest(rid, [1, 2, 3], SamplingParams(max_tokens=n, temperature=0))


def test_steps_emit_one_token_per_sequence_until_max_tokens() -> None:
    e = SyntheticEngine(linear_profile(0.0, 0.0, 4), max_batch=2)
    for rid, n in (("a", 2), ("b", 3), ("c", 1)):
        e.add_request(_req(rid, n))
    first = e.step()
    assert first.stats.batch_size == 2 and first.stats.waiting == 1  # c waits for a slot
    assert [(o.request_id, len(o.new_token_ids), o.finished) for o in first.outputs] == [
        ("a", 1, False), ("b", 1, False)
    ]  # fmt: skip
    done: dict[str, int] = {}
    while e.has_unfinished():
        for o in e.step().outputs:
            if o.finished:
                done[o.request_id] = o.num_output_tokens
                assert o.finish_reason == "length"
    assert done == {"a": 2, "b": 3, "c": 1}
    e.add_request(_req("d", 100))
    e.step()
    e.abort_request("d")
    (out,) = e.step().outputs
    assert out.finished and out.finish_reason == "cancelled"
    assert e.profile.step(64, 0) == pytest.approx(1e-5)  # the profile's floor (FLOOR_S)


def test_the_factory_makes_it_and_refuses_unknown_engines(tmp_path: Path) -> None:
    e = create_engine(tmp_path, engine="synthetic", base_ms=20, per_seq_ms=0.5, max_batch=32)
    assert isinstance(e, SyntheticEngine) and e.profile.step(32, 0) == pytest.approx(0.036)
    path = tmp_path / "p.json"
    path.write_text(linear_profile(5, 1, 8, model="m").dumps())
    assert create_engine(tmp_path, engine="synthetic", profile=str(path)).profile.model == "m"  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="unknown engine"):
        create_engine(tmp_path, engine="warp")


@pytest.mark.anyio
async def test_a_worker_on_it_serves_jobs_through_redis(r: aioredis.Redis, model_dir: Path) -> None:
    engine = SyntheticEngine(linear_profile(1.0, 0.01, 16), max_batch=16)
    settings = WorkerSettings(model_dir=str(model_dir), worker_id="fake-1", model_name="m")
    w = WorkerService(settings, engine=engine, prompts=PromptEncoder.from_dir(model_dir), redis=r)
    for i in range(5):
        job = JobRequest(job_id=f"j{i}", model="m", prompt=f"hello {i}", params=SamplingParams(max_tokens=7))
        await r.hset(keys.job_key("m", job.job_id), mapping={jobs.STATUS: "queued"})
        await r.xadd(keys.jobs_stream("m"), codec.entry(job))
    with anyio.fail_after(30):
        await w.run(burst=True)
    for i in range(5):
        events = [codec.from_entry(f) for _, f in await r.xrange(keys.job_events("m", f"j{i}"))]
        tokens = [t for e in events if isinstance(e, TokenEvent) for t in e.token_ids]
        (final,) = [e for e in events if isinstance(e, FinishEvent)]
        assert len(tokens) == 7 and final.token_ids == tokens and final.finish_reason == "length"
