"""Where the worker runs its engine steps: short ones on the event loop, big prefills in a thread."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import redis.asyncio as aioredis

import worker.service as service
from shared.schemas import FinishEvent, JobRequest, SamplingParams
from tests.tiny_models import reference_greedy
from tests.worker.service_helpers import drain, enqueue, make_worker, read_events
from worker.engine.api import Engine, StepResult
from worker.prompts import PromptEncoder

pytestmark = pytest.mark.anyio


async def test_short_steps_run_on_the_event_loop_and_big_prefills_in_a_thread(
    r: aioredis.Redis,
    model_dir: Path,
    engine: Engine,
    prompts: PromptEncoder,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(service, "INLINE_STEP_S", 3600.0)  # every step counts as short
    monkeypatch.setattr(service, "INLINE_PREFILL_TOKENS", 3)
    steps: list[tuple[bool, int]] = []  # (on the event loop, prompt tokens it prefilled)
    real_step = engine.step

    def step() -> StepResult:
        result = real_step()
        steps.append((threading.current_thread() is threading.main_thread(), result.stats.prefill_tokens))
        return result

    engine.step = step  # type: ignore[method-assign]
    w = make_worker(r, model_dir, engine, prompts)
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    await enqueue(r, JobRequest(job_id="s", prompt="Hi", params=params))  # 3 prompt tokens
    await drain(w)
    assert steps[0][0] is False  # the first step of all: nothing says it is short
    assert all(on_loop for on_loop, _ in steps[1:]) and sum(n > 0 for _, n in steps) == 1
    steps.clear()
    long_prompt = "Once upon a time there was a little fox who lived in the woods"
    await enqueue(r, JobRequest(job_id="t", prompt=long_prompt, params=params))
    await drain(w)
    prefills = [on_loop for on_loop, n in steps if n > 0]
    assert prefills == [False] and all(on_loop for on_loop, n in steps if n == 0)
    expected = reference_greedy(model_dir, prompts.tokenizer(long_prompt)["input_ids"], 6)
    final = (await read_events(r, "t"))[-1]
    assert isinstance(final, FinishEvent) and final.token_ids == expected


async def test_each_step_carries_the_services_own_time_since_the_last_one(
    r: aioredis.Redis, model_dir: Path, engine: Engine, prompts: PromptEncoder
) -> None:
    """``gap_time``: the worker's time between one step's end and the next one's start (what
    the planner adds to a step's cost as served); 0 for a step after waiting for work."""
    stats = []
    real_step = engine.step

    def step() -> StepResult:
        result = real_step()
        stats.append(result.stats)  # the service sets gap_time on it after the step
        return result

    engine.step = step  # type: ignore[method-assign]
    w = make_worker(r, model_dir, engine, prompts)
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    for job in ("a", "b"):
        await enqueue(r, JobRequest(job_id=job, prompt="Hi", params=params))
        await drain(w)
    firsts = [s for s in stats if s.batch_size == 0 and s.num_tokens == 1]  # a prompt's first token
    decodes = [s for s in stats if s.batch_size > 0]
    assert len(firsts) == 2 and len(decodes) == 10
    assert all(s.gap_time == 0.0 for s in firsts)  # each came after waiting for work
    assert all(0.0 < s.gap_time < 5.0 for s in decodes)
