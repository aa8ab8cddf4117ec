"""Each output says which of its tokens were accepted drafts (``RequestOutput.outcomes``):
exact against what verification did, with a drafter that is always right, one that is
mostly wrong, and no speculation at all."""

from __future__ import annotations

from pathlib import Path

from shared.control import ALL_BATCHES, Decision
from shared.schemas import SamplingParams
from tests.worker.engine.drive import Run
from tests.worker.engine.prompts import PROMPTS
from worker.engine.api import DraftOutcome, EngineRequest
from worker.engine.engine import LLMEngine
from worker.engine.loader import load_engine
from worker.speculation import apply_decision

NEW = 20


def run_with(spec_models: dict[str, Path], drafter: str, gamma: int) -> tuple[Run, list[list[DraftOutcome]]]:
    """Greedy requests under one drafter and γ; the run and every step's outcomes."""
    engine: LLMEngine = load_engine(
        spec_models["target"], drafters=[spec_models[drafter]], block_size=4, num_blocks=128
    )
    apply_decision(
        engine, Decision(version=1, policy="test", gamma_table=[(ALL_BATCHES, gamma)], drafter=drafter)
    )
    params = SamplingParams(max_tokens=NEW, ignore_eos=True)
    for i, p in enumerate(PROMPTS[:4]):
        engine.add_request(EngineRequest(str(i), p, params))
    run, per_step = Run(), []
    while engine.has_unfinished():
        result = engine.step()
        run.stats.append(result.stats)
        per_step.append([o for out in result.outputs for o in out.outcomes])
        for out in result.outputs:
            run.tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
            assert sum(o.tokens for o in out.outcomes) == len(out.new_token_ids)
    return run, per_step


def test_an_always_right_drafter_has_every_draft_accepted(spec_models: dict[str, Path]) -> None:
    run, per_step = run_with(spec_models, "copy", 3)
    drafting = [o for step in per_step for o in step if o.drafted]
    assert drafting, "nothing was drafted: the test checks nothing"
    for o in drafting:
        assert o.drafter == "copy" and o.accepted == o.drafted <= o.gamma <= 3
        # all accepted: the bonus token is the target's own, unless max_tokens cut it
        assert o.tokens in (o.accepted, o.accepted + 1)
    assert sum(o.accepted for o in drafting) == run.total("accepted")
    assert sum(o.tokens for step in per_step for o in step) == sum(len(t) for t in run.tokens.values())


def test_a_mostly_wrong_drafter_marks_only_what_verification_kept(spec_models: dict[str, Path]) -> None:
    run, per_step = run_with(spec_models, "rand-a", 3)
    for step, stats in zip(per_step, run.stats, strict=True):
        # nothing is cut here (ignore_eos; max_tokens only shortens γ): the step's accepted
        # drafts are exactly those the outcomes mark
        assert sum(o.accepted for o in step) == stats.accepted
        assert all(o.tokens == o.accepted + 1 for o in step)
    drafting = [o for step in per_step for o in step if o.drafted]
    assert any(o.accepted < o.drafted for o in drafting), "every draft passed: not a wrong drafter"


def test_no_speculation_marks_every_token_the_targets(spec_models: dict[str, Path]) -> None:
    run, per_step = run_with(spec_models, "copy", 0)
    outcomes = [o for step in per_step for o in step]
    assert outcomes and all(o == DraftOutcome(tokens=1) for o in outcomes)
    assert run.total("proposed") == 0
