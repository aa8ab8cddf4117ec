"""Greedy speculative runs under a random schedule: a fresh decision (γ per batch bucket,
drafter, offload) before every step, checked against the target alone."""

from __future__ import annotations

import random

from shared.control import ALL_BATCHES, Decision
from tests.worker.engine.drive import Run, check_outcomes
from worker.engine.api import EngineRequest
from worker.engine.engine import LLMEngine
from worker.speculation import apply_decision

NEW = 24
NAMES = ["copy", "layer0", "rand-a", "rand-b", "ngram"]


def scheduled_run(
    engine: LLMEngine, reqs: list[EngineRequest], seed: int, offload_steps: set[int], per_step: int = 3
) -> Run:
    """Like ``drive``, with a fresh random decision before every step."""
    rng = random.Random(seed)
    pending, run, drafter = list(reqs), Run(), None
    for step in range(10_000):
        for req in pending[:per_step]:
            engine.add_request(req)
        del pending[:per_step]
        if not pending and not engine.has_unfinished():
            return run
        if rng.random() < 0.3:
            drafter = rng.choice([*NAMES, None, "no-such-drafter"])
        table = [(1, rng.randrange(5)), (4, rng.randrange(5)), (ALL_BATCHES, rng.randrange(5))]
        apply_decision(
            engine,
            Decision(
                version=step + 1,
                policy="test",
                gamma_table=table,
                drafter=drafter,
                offload=step in offload_steps,
            ),
        )
        result = engine.step()
        run.stats.append(result.stats)
        for out in result.outputs:
            check_outcomes(out)
            run.tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
            if out.finished:
                run.finals[out.request_id] = out
    raise AssertionError("the engine did not finish")
