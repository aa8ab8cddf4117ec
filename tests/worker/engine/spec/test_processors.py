"""Logits processors (penalties, logit_bias, min_tokens) keep speculation exact: greedy
output with drafts equals the target's own under the same processors, and both equal an
independent reference written here over transformers' forward."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import torch

from shared.control import ALL_BATCHES, Decision
from shared.schemas import SamplingParams
from tests.worker.engine.drive import drive
from tests.worker.engine.prompts import PROMPTS
from tests.worker.engine.tiny import hf_greedy, hf_model
from worker.engine.api import EngineRequest
from worker.engine.loader import load_engine
from worker.speculation import apply_decision

NEW = 16
PARAMS = SamplingParams(
    max_tokens=NEW,
    repetition_penalty=1.3,
    presence_penalty=0.4,
    frequency_penalty=0.3,
    logit_bias={5: 2.5, 7: -1.0},
    min_tokens=6,
)


def reference(model: Any, prompt: list[int], p: SamplingParams, eos: set[int]) -> list[int]:
    """Greedy decoding with the processors applied by hand, one full forward per token."""
    gen: list[int] = []
    with torch.inference_mode():
        for _ in range(p.max_tokens):
            row = model(torch.tensor([prompt + gen])).logits[0, -1].float().clone()
            for t in set(prompt + gen):
                row[t] = row[t] / p.repetition_penalty if row[t] > 0 else row[t] * p.repetition_penalty
            for t, n in Counter(gen).items():
                row[t] -= p.frequency_penalty * n + p.presence_penalty
            for t, b in p.logit_bias.items():
                row[t] += b
            if len(gen) < p.min_tokens:
                for t in eos:
                    row[t] = float("-inf")
            tok = int(row.argmax())
            gen.append(tok)
            if tok in eos:
                break
    return gen


def test_processed_greedy_is_exact_with_and_without_speculation(spec_models: dict[str, Path]) -> None:
    hf = hf_model(spec_models["target"])
    prompts = PROMPTS[:6]
    runs = []
    for gamma in (0, 4):
        engine = load_engine(
            spec_models["target"], drafters=[spec_models["copy"]], block_size=4, num_blocks=256
        )
        apply_decision(
            engine, Decision(version=1, policy="test", gamma_table=[(ALL_BATCHES, gamma)], drafter="copy")
        )
        runs.append(drive(engine, [EngineRequest(str(i), p, PARAMS) for i, p in enumerate(prompts)]))
        eos = set(engine.eos_token_ids)
    plain, spec = runs
    assert sum(s.accepted for s in spec.stats) > 0, "no draft was accepted: nothing was verified"
    changed = 0
    for i, p in enumerate(prompts):
        want = reference(hf, p, PARAMS, eos)
        assert plain.tokens[str(i)] == want, f"prompt {i}: the engine alone differs from the reference"
        assert spec.tokens[str(i)] == want, f"prompt {i}: speculation changed the processed output"
        changed += want != hf_greedy(hf, p, len(want), stop_at_eos=False)
    assert changed, "the processors changed no output: the test checks nothing"


def test_sampled_requests_are_processed_too(spec_models: dict[str, Path]) -> None:
    """min_tokens holds under rejection sampling with drafts, and a large logit_bias wins."""
    engine = load_engine(spec_models["target"], drafters=[spec_models["copy"]], block_size=4, num_blocks=256)
    apply_decision(engine, Decision(version=1, policy="test", gamma_table=[(ALL_BATCHES, 4)], drafter="copy"))
    eos = set(engine.eos_token_ids)
    banned = SamplingParams(max_tokens=12, temperature=1.5, seed=3, min_tokens=12, stop_token_ids=[9])
    forced = SamplingParams(max_tokens=6, temperature=1.0, seed=4, logit_bias={11: 100.0})
    reqs = [EngineRequest(f"b{i}", p, banned) for i, p in enumerate(PROMPTS[:8])]
    reqs += [EngineRequest(f"f{i}", p, forced) for i, p in enumerate(PROMPTS[:4])]
    run = drive(engine, reqs)
    for i in range(8):
        out = run.tokens[f"b{i}"]
        assert len(out) == 12 and not (set(out) & (eos | {9}))
    assert all(run.tokens[f"f{i}"] == [11] * 6 for i in range(4))
