"""Greedy speculative decoding equals the target alone, token for token: random γ per step
and per batch bucket, drafter switches (including unknown names), offload and reload in the
middle of generation under a KV pool tight enough that the shrink moves live blocks and
preempts, chunked prefill, prefix hits and exact repeats, EOS inside accepted drafts, and
the max_tokens / context limits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shared.control import ALL_BATCHES, Decision
from shared.schemas import SamplingParams
from tests.worker.engine.drive import drive
from tests.worker.engine.prompts import PROMPTS
from tests.worker.engine.spec.references import NEW, scheduled_run
from tests.worker.engine.tiny import hf_greedy, hf_model
from worker.engine.api import EngineRequest
from worker.engine.loader import load_engine
from worker.speculation import apply_decision


@pytest.mark.parametrize(
    ("seed", "config"),
    [
        (0, dict(block_size=4, num_blocks=40, max_num_batched_tokens=64)),
        (1, dict(block_size=4, num_blocks=48, max_num_batched_tokens=32, counterfactual_every=3)),
        (2, dict(block_size=8, num_blocks=24, max_num_batched_tokens=48, enable_prefix_caching=False)),
    ],
)
def test_greedy_is_exact_under_random_speculation_and_offload(
    spec_models: dict[str, Path],
    drafter_dirs: list[Path],
    spec_references: list[list[int]],
    seed: int,
    config: dict[str, Any],
) -> None:
    engine = load_engine(spec_models["target"], drafters=drafter_dirs, **config)
    params = SamplingParams(max_tokens=NEW, ignore_eos=True)
    reqs = [EngineRequest(str(i), p, params) for i, p in enumerate(PROMPTS)]
    offload = set(range(12, 30)) | set(range(36, 46))
    run = scheduled_run(engine, reqs, seed, offload)

    wrong = [i for i, ref in enumerate(spec_references) if run.tokens[str(i)] != ref]
    assert not wrong, f"requests {wrong} differ from the target alone"
    assert all(f.finish_reason == "length" for f in run.finals.values())
    # The run exercised what it claims to.
    assert 0 < run.total("accepted") < run.total("proposed")
    assert len({s.drafter for s in run.stats if s.gamma}) >= 3
    assert all(s.gamma == 0 for s in run.stats if not s.draft_resident)
    events = [e for s in run.stats for e in s.memory_events]
    kinds = [e.kind for e in events]
    assert kinds[:4] == ["offload", "reload", "offload", "reload"]
    reloads = [e for e in events if e.kind == "reload"]
    assert sum(e.moved_blocks for e in reloads) > 0
    assert sum(e.preempted for e in reloads) + run.total("preempted") > 0
    assert any(s.switch_costs for s in run.stats)
    if config.get("enable_prefix_caching", True):
        assert run.total("prefix_hits") > 0
    assert engine.blocks.num_free_blocks == engine.blocks.num_blocks
    for d in engine.spec.pool.models if engine.spec.pool else []:
        assert not d.computed and d.blocks.num_free_blocks == d.blocks.num_blocks


def test_eos_inside_accepted_drafts_ends_the_sequence_there(spec_models: dict[str, Path]) -> None:
    hf = hf_model(spec_models["target"])
    prompts = PROMPTS[:16]
    engine = load_engine(spec_models["target"], drafters=[spec_models["copy"]], block_size=4, num_blocks=256)
    apply_decision(engine, Decision(version=1, policy="test", gamma_table=[(ALL_BATCHES, 4)]))
    run = drive(
        engine, [EngineRequest(str(i), p, SamplingParams(max_tokens=40)) for i, p in enumerate(prompts)]
    )
    stopped = 0
    for i, p in enumerate(prompts):
        assert run.tokens[str(i)] == hf_greedy(hf, p, 40, stop_at_eos=True)
        stopped += run.finals[str(i)].finish_reason == "stop"
    assert stopped > 0, "no prompt hit EOS: the test checks nothing about stopping"


@pytest.mark.parametrize("max_tokens", [1, 2, 5, 7])
def test_limits_are_never_overshot(spec_models: dict[str, Path], max_tokens: int) -> None:
    """max_tokens, and a context limit of 40 tokens, with γ = 6 and a drafter that is
    always right: γ shrinks per sequence near the end instead of emitting past it."""
    prompts = [PROMPTS[0][:33], PROMPTS[1], PROMPTS[4]]
    runs = []
    for gamma in (0, 6):
        engine = load_engine(
            spec_models["target"],
            drafters=[spec_models["copy"]],
            block_size=4,
            num_blocks=64,
            max_model_len=40,
        )
        apply_decision(engine, Decision(version=1, policy="test", gamma_table=[(ALL_BATCHES, gamma)]))
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        runs.append(drive(engine, [EngineRequest(str(i), p, params) for i, p in enumerate(prompts)]))
    base, spec = runs
    assert spec.tokens == base.tokens
    for i, p in enumerate(prompts):
        assert len(spec.tokens[str(i)]) == min(max_tokens, 40 - len(p))
    assert spec.total("accepted") > 0 or max_tokens <= 2
