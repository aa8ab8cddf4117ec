"""Speculative sampling in the engine keeps the target's distribution (chi-square).

A target and a drafter with a 10-token vocabulary; 3000 seeded requests of one prompt with
temperature, top-k and top-p. The first output token comes from the prompt's logits; the
next two come from a speculative step (γ = 3). Their joint frequencies are compared with the
exact target distribution Σ_x1 p(x1) p(x2|x1) p(x3|x1,x2), warped the same way. Seeded
requests draw keyed on (seed, position), their drafts coupled to the target's noise and kept
when they equal its draws (keyed.py); the "rejection" case runs the same requests through
rejection sampling, drafts drawn with each request's generator (what an unseeded request does:
its generator is seeded here so that the test is reproducible).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from scipy.stats import chisquare

from shared.control import ALL_BATCHES, Decision
from tests.worker.engine.drive import drive
from tests.worker.engine.spec.distribution import PARAMS, PROMPT, TRIALS, V, expected_pairs
from worker.engine import sampler, sequence
from worker.engine.api import EngineRequest
from worker.engine.loader import load_engine
from worker.speculation import apply_decision


@pytest.mark.parametrize(
    ("drafter", "scheme"), [("draft", "keyed"), ("ngram", "keyed"), ("draft", "rejection")]
)
def test_speculative_sampling_keeps_the_target_distribution(
    small_vocab: dict[str, Path], drafter: str, scheme: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if scheme == "rejection":  # seeded generators, no keyed draws
        monkeypatch.setattr(sequence, "is_keyed", lambda p: False)
        monkeypatch.setattr(sampler, "is_keyed", lambda p: False)
    engine = load_engine(
        small_vocab["target"],
        drafters=[small_vocab["draft"]],
        block_size=4,
        num_blocks=1024,
        max_num_seqs=256,
    )
    apply_decision(
        engine, Decision(version=1, policy="test", gamma_table=[(ALL_BATCHES, 3)], drafter=drafter)
    )
    reqs = [EngineRequest(str(i), PROMPT, PARAMS.model_copy(update={"seed": i})) for i in range(TRIALS)]
    run = drive(engine, reqs)
    spec_steps = [s for s in run.stats if s.gamma > 0]
    assert spec_steps and all(s.drafter == drafter for s in spec_steps)
    assert 0 < run.total("accepted") < run.total("proposed"), "both acceptance and rejection must occur"

    observed = torch.zeros(V, V, dtype=torch.float64)
    for tokens in run.tokens.values():
        observed[tokens[1], tokens[2]] += 1
    expected = expected_pairs(small_vocab["target"]) * TRIALS
    # Cells expected to hold fewer than 5 draws are pooled into one bin.
    small = expected < 5
    obs = torch.cat([observed[~small], observed[small].sum().view(1)])
    exp = torch.cat([expected[~small], expected[small].sum().view(1)])
    result = chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item())
    assert result.pvalue > 1e-3, result
