"""The feature drafter inside the engine: greedy output equals the target alone under random
γ schedules, drafter switches (catch-up after γ = 0 and after other drafters), offload and
reload mid-generation, chunked prefill, prefix hits and exact repeats; speculative sampling
with it keeps the target's distribution (chi-square); hidden states are taken from the
target's forward only while a feature drafter is resident."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch
from scipy.stats import chisquare

from shared.control import ALL_BATCHES, Decision
from shared.schemas import SamplingParams
from tests.worker.engine.drive import drive
from tests.worker.engine.prompts import PROMPTS
from tests.worker.engine.spec.distribution import PARAMS, PROMPT, TRIALS, V, expected_pairs
from tests.worker.engine.spec.feature_heads import trained_head
from tests.worker.engine.spec.references import NEW, scheduled_run
from worker.engine.api import EngineRequest
from worker.engine.loader import load_engine
from worker.engine.spec.feature_drafter import FeatureDrafter
from worker.speculation import apply_decision


@pytest.mark.parametrize(
    ("seed", "config"),
    [
        (3, dict(block_size=4, num_blocks=40, max_num_batched_tokens=64)),
        (4, dict(block_size=8, num_blocks=24, max_num_batched_tokens=32, counterfactual_every=2)),
    ],
)
def test_greedy_is_exact_with_a_feature_drafter(
    spec_models: dict[str, Path],
    head_dir: Path,
    spec_references: list[list[int]],
    seed: int,
    config: dict[str, Any],
) -> None:
    engine = load_engine(spec_models["target"], drafters=[head_dir, spec_models["rand-a"]], **config)
    fd = engine.spec.pool.drafters["fd-head"] if engine.spec.pool else None
    assert isinstance(fd, FeatureDrafter) and engine.spec.pool and engine.spec.pool.default == "fd-head"
    params = SamplingParams(max_tokens=NEW, ignore_eos=True)
    reqs = [EngineRequest(str(i), p, params) for i, p in enumerate(PROMPTS)]
    run = scheduled_run(engine, reqs, seed, set(range(12, 30)))

    wrong = [i for i, ref in enumerate(spec_references) if run.tokens[str(i)] != ref]
    assert not wrong, f"requests {wrong} differ from the target alone"
    mine = [s for s in run.stats if s.drafter == "fd-head"]
    assert mine and 0 < sum(s.accepted for s in mine) < sum(s.proposed for s in mine)
    assert any(c.drafter == "fd-head" for s in run.stats for c in s.switch_costs), "no catch-up measured"
    assert any("fd-head" in s.counterfactual for s in run.stats if s.drafter != "fd-head")
    kinds = [e.kind for s in run.stats for e in s.memory_events]
    assert kinds[:2] == ["offload", "reload"]
    assert run.total("prefix_hits") > 0
    # Everything is freed with the sequences: cache blocks, pending features, bookkeeping.
    assert not fd.pending and not fd.base and not fd.computed
    assert fd.blocks.num_free_blocks == fd.blocks.num_blocks
    assert engine.blocks.num_free_blocks == engine.blocks.num_blocks


def test_features_only_when_a_feature_drafter_is_resident(
    spec_models: dict[str, Path], head_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = {"features": 0}
    plain = load_engine(spec_models["target"], drafters=[spec_models["rand-a"]], block_size=4, num_blocks=64)
    engine = load_engine(spec_models["target"], drafters=[head_dir], block_size=4, num_blocks=64)
    for e in (plain, engine):
        orig = e.runner.run_with_features

        def counted(items: Any, orig: Any = orig) -> Any:
            calls["features"] += 1
            return orig(items)

        monkeypatch.setattr(e.runner, "run_with_features", counted)
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    apply_decision(plain, Decision(version=1, policy="t", gamma_table=[(ALL_BATCHES, 2)]))
    drive(plain, [EngineRequest("a", PROMPTS[1], params)])
    assert calls["features"] == 0
    apply_decision(engine, Decision(version=1, policy="t", gamma_table=[(ALL_BATCHES, 0)], offload=True))
    drive(engine, [EngineRequest("b", PROMPTS[1], params)])
    assert calls["features"] == 0, "offloaded: no hidden states"
    apply_decision(engine, Decision(version=2, policy="t", gamma_table=[(ALL_BATCHES, 0)]))
    deadline = time.monotonic() + 30  # the weights come back in the background: wait for them
    while not engine.memory.resident and time.monotonic() < deadline:
        engine.step()
    assert engine.memory.resident, "the feature drafter was not reloaded within 30 s"
    drive(engine, [EngineRequest("c", PROMPTS[1], params)])
    assert calls["features"] > 0, "resident (even at γ = 0): hidden states kept for catch-up"


def test_speculative_sampling_with_a_feature_drafter_keeps_the_target_distribution(
    small_vocab: dict[str, Path], tmp_path: Path
) -> None:
    # A reduced vocabulary of 8 of the 10 tokens: the drafter never proposes the other two.
    head = trained_head(small_vocab["target"], tmp_path / "fd-small", steps=30, vocab=8)
    engine = load_engine(
        small_vocab["target"], drafters=[head], block_size=4, num_blocks=1024, max_num_seqs=256
    )
    apply_decision(
        engine, Decision(version=1, policy="t", gamma_table=[(ALL_BATCHES, 3)], drafter="fd-small")
    )
    reqs = [EngineRequest(str(i), PROMPT, PARAMS.model_copy(update={"seed": i})) for i in range(TRIALS)]
    run = drive(engine, reqs)
    spec_steps = [s for s in run.stats if s.gamma > 0]
    assert spec_steps and all(s.drafter == "fd-small" for s in spec_steps)
    assert 0 < run.total("accepted") < run.total("proposed")
    observed = torch.zeros(V, V, dtype=torch.float64)
    for tokens in run.tokens.values():
        observed[tokens[1], tokens[2]] += 1
    expected = expected_pairs(small_vocab["target"]) * TRIALS
    small = expected < 5
    obs = torch.cat([observed[~small], observed[small].sum().view(1)])
    exp = torch.cat([expected[~small], expected[small].sum().view(1)])
    result = chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item())
    assert result.pvalue > 1e-3, result
