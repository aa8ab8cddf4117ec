"""The tiny engine tests' prompts: a shared system prefix, tails of random lengths, a
prompt that is exactly the prefix, and exact repeats (prefix hits and repeat skips)."""

from __future__ import annotations

import random

from tests.worker.engine.tiny import VOCAB

NEW = 16


def make_prompts() -> list[list[int]]:
    rng = random.Random(7)
    system = [rng.randrange(3, VOCAB) for _ in range(21)]
    prompts = []
    for i in range(32):
        tail = [rng.randrange(3, VOCAB) for _ in range(rng.randrange(1, 40))]
        prompts.append(system + tail if i % 3 == 0 else tail)
    prompts.append(system)  # a prompt that is exactly the shared prefix
    return [*prompts, prompts[0], prompts[5], prompts[9]]  # exact repeats


PROMPTS = make_prompts()
