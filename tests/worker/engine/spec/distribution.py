"""The distribution case of the speculative-sampling tests: a 10-token vocabulary, one
prompt, warped sampling parameters, and the exact joint distribution of output tokens 2 and
3 under the target (what the engine's draws are compared with)."""

from __future__ import annotations

from pathlib import Path

import torch

from shared.schemas import SamplingParams
from tests.worker.engine.tiny import hf_model
from worker.engine.sampler import filtered_probs

V = 10
PROMPT = [1, 5, 3, 7]
PARAMS = SamplingParams(max_tokens=5, temperature=0.9, top_k=8, top_p=0.95, ignore_eos=True)
TRIALS = 3000


def expected_pairs(target: Path) -> torch.Tensor:
    """[V, V] probabilities of output tokens 2 and 3."""
    hf = hf_model(target)

    def warped(prefixes: list[list[int]]) -> torch.Tensor:
        with torch.inference_mode():
            logits = hf(torch.tensor(prefixes)).logits[:, -1]
        return filtered_probs(logits, [PARAMS] * len(prefixes)).double()

    p1 = warped([PROMPT])[0]  # [V]
    p2 = warped([[*PROMPT, a] for a in range(V)])  # [V(x1), V(x2)]
    p3 = warped([[*PROMPT, a, b] for a in range(V) for b in range(V)]).view(V, V, V)
    return (p1.view(V, 1, 1) * p2.view(V, V, 1) * p3).sum(0)
