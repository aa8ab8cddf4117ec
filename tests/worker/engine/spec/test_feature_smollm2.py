"""SmolLM2-135M-Instruct with its EAGLE-style heads (models/smol-eagle-*): greedy output equals
transformers' generate token for token under a random per-step γ and drafter schedule, with
catch-up after γ = 0, an offload and reload in the middle of generation, and prefix hits (the
chat template's shared system prompt); seeded sampled output equals plain decoding's under
the same schedule. A missing model or head FAILS with the command."""

from __future__ import annotations

import pytest

from shared.control import ALL_BATCHES, Decision
from shared.schemas import SamplingParams
from tests.worker.engine.drive import drive
from tests.worker.engine.encoding import encode
from tests.worker.engine.spec.smollm2 import HEADS, SMOL, TEXTS, schedule
from tests.worker.engine.tiny import hf_greedy, hf_model
from worker.engine.api import EngineRequest
from worker.engine.loader import load_engine
from worker.engine.spec.feature_drafter import FeatureDrafter
from worker.speculation import apply_decision

NEW = 28

pytestmark = pytest.mark.smollm2


def _require() -> None:
    if not (SMOL / "config.json").is_file():
        pytest.fail(f"{SMOL} is missing: run `nightjar models smollm2`", pytrace=False)
    for h in HEADS:
        if not (h / "config.json").is_file():
            pytest.fail(f"{h} is missing: run `nightjar models train-eagle`", pytrace=False)


def test_smollm2_greedy_is_exact_with_its_feature_heads() -> None:
    _require()
    engine = load_engine(SMOL, drafters=HEADS, block_size=16, num_blocks=96, max_num_batched_tokens=128)
    assert engine.spec.pool is not None
    assert all(isinstance(engine.spec.pool.drafters[h.name], FeatureDrafter) for h in HEADS)
    prompts = [encode(engine.tokenizer, "smollm2", t) for t in TEXTS]
    params = SamplingParams(max_tokens=NEW, ignore_eos=True)
    reqs = [EngineRequest(str(i), p, params) for i, p in enumerate(prompts)]
    run = schedule(engine, reqs, seed=0, offload=set(range(20, 28)))
    hf = hf_model(SMOL)
    for i, p in enumerate(prompts):
        assert run.tokens[str(i)] == hf_greedy(hf, p, NEW, stop_at_eos=False), f"request {i} differs"
    heads = {h.name for h in HEADS}
    spec = [s for s in run.stats if s.drafter in heads]
    assert spec and sum(s.accepted for s in spec) > 0, "the heads were never accepted"
    assert any(c.drafter in heads for s in run.stats for c in s.switch_costs), "no catch-up measured"
    assert [e.kind for s in run.stats for e in s.memory_events][:2] == ["offload", "reload"]
    assert sum(s.prefix_hits for s in run.stats) > 0
    for h in HEADS:
        d = engine.spec.pool.drafters[h.name]
        assert isinstance(d, FeatureDrafter) and not d.pending and not d.base


def test_smollm2_seeded_sampling_is_the_same_text_under_its_heads() -> None:
    """Seeded sampling (keyed draws, worker/engine/keyed.py) on the real model: the random
    γ / head / n-gram / offload schedule gives the text of plain decoding, token for token."""
    _require()
    engine = load_engine(SMOL, drafters=HEADS, block_size=16, num_blocks=96, max_num_batched_tokens=128)
    prompts = [encode(engine.tokenizer, "smollm2", t) for t in TEXTS]
    kinds = [dict(temperature=0.8), dict(temperature=1.0, top_p=0.9), dict(temperature=0.6, top_k=40)]
    reqs = [
        EngineRequest(str(i), p, SamplingParams(max_tokens=NEW, ignore_eos=True, seed=7 + i, **kinds[i % 3]))
        for i, p in enumerate(prompts)
    ]
    apply_decision(engine, Decision(version=1, policy="test", gamma_table=[(ALL_BATCHES, 0)]))
    plain = drive(
        engine, [EngineRequest(f"plain-{r.request_id}", r.prompt_token_ids, r.params) for r in reqs]
    )
    run = schedule(engine, reqs, seed=1, offload=set(range(20, 28)))
    for r in reqs:
        assert run.tokens[r.request_id] == plain.tokens[f"plain-{r.request_id}"], f"request {r.request_id}"
    heads = {h.name for h in HEADS}
    spec = [s for s in run.stats if s.drafter in heads]
    assert spec and sum(s.accepted for s in spec) > 0, "the heads were never accepted"
