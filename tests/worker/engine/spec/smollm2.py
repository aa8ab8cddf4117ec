"""SmolLM2 with its two EAGLE heads (models/, exported by `make test`): the checkpoints,
the prompts, and a random schedule of γ, drafters (heads and n-gram) and offloads."""

from __future__ import annotations

import random
from pathlib import Path

from shared.control import ALL_BATCHES, Decision
from tests.worker.engine.drive import Run
from worker.engine.api import EngineRequest
from worker.engine.engine import LLMEngine
from worker.speculation import apply_decision

ROOT = Path(__file__).resolve().parents[4]
SMOL = ROOT / "models" / "smollm2-135m-instruct"
HEADS = [ROOT / "models" / "smol-eagle-chat", ROOT / "models" / "smol-eagle-code"]
TEXTS = [
    "Explain why the sky is blue.",
    "Write a Python function that reverses a list.",
    "Give three tips for staying healthy.",
    "What is the capital of France?",
]


def schedule(engine: LLMEngine, reqs: list[EngineRequest], seed: int, offload: set[int]) -> Run:
    rng = random.Random(seed)
    pending, run, drafter = list(reqs), Run(), "smol-eagle-chat"
    for step in range(2000):
        if pending and step % 3 == 0:
            engine.add_request(pending.pop(0))  # arrivals while others decode: catch-ups
        if not pending and not engine.has_unfinished():
            return run
        if rng.random() < 0.3:
            drafter = rng.choice(["smol-eagle-chat", "smol-eagle-code", "ngram"])
        gamma = rng.choice([0, 0, 1, 2, 3, 4, 6])
        apply_decision(
            engine,
            Decision(
                version=step + 1,
                policy="test",
                gamma_table=[(ALL_BATCHES, gamma)],
                drafter=drafter,
                offload=step in offload,
            ),
        )
        result = engine.step()
        run.stats.append(result.stats)
        for out in result.outputs:
            run.tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    raise AssertionError("the engine did not finish")
