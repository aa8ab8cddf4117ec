"""What the cost rule knows of a sequence besides its own verifications
(worker/engine/spec/scoring.py): its drafters scored on its prompt, centred on the planner's
prior, and on its own output while it runs γ = 0, within a share of the step's time. The
engine tests run the bench in cost_rule.py.
"""

from __future__ import annotations

import pytest

from tests.worker.engine.spec.cost_rule import (
    CODE,
    CODE_PROMPTS,
    DRAFTERS,
    PLAIN,
    PROSE,
    STORY_PROMPTS,
    drain,
    nj_engine,
    rule_decision,
)
from worker.engine.spec import plan, scoring
from worker.engine.spec.plan import SeqSpec
from worker.engine.spec.pool import DrafterPool
from worker.engine.spec.scoring import PromptCentre


def test_the_prompt_prior_shifts_the_planners_prior_by_the_prompts_distance_from_recent_ones() -> None:
    """A drafter that agrees with every chat prompt's text at 15 % (its answers' drafts at 35 %,
    the planner's prior) starts each chat request at its prior, not at 15 %; a prompt it agrees
    with more than with the recent ones starts above the prior, one it agrees with less below."""
    centre = PromptCentre()
    prior = {CODE: 0.35, PROSE: 0.5}
    for _ in range(20):
        (got,) = centre.centred([{CODE: (3.6, 24)}], prior)
        assert got[CODE] == (pytest.approx(0.35 * 24), 24)
    above, below = centre.centred([{CODE: (12.0, 24)}, {CODE: (0.0, 24)}], prior)
    assert above[CODE][0] / 24 > 0.35 + 0.2 and below[CODE][0] / 24 < 0.35 - 0.05
    # the first prompts of a batch rank against each other: a code prompt above a story one
    fresh = PromptCentre().centred(
        [{CODE: (12.0, 24), PROSE: (2.0, 24)}, {CODE: (2.0, 24), PROSE: (12.0, 24)}], prior
    )
    assert fresh[0][CODE][0] > fresh[1][CODE][0] and fresh[1][PROSE][0] > fresh[0][PROSE][0]
    assert all(0.0 <= a <= n for row in fresh for a, n in row.values())


def test_a_prompt_every_model_drafter_finds_easier_raises_none_over_the_others() -> None:
    """SmolLM2 after a chat phase: both heads agree more with a code prompt than with the chat
    prompts before it (26 % against 11-13 %), and the chat head is accepted less on its
    answer. Ranked against each other, neither starts above its prior; a prompt one of them
    finds easier than the other still ranks it first; n-gram keeps its own shift."""
    chat, code, ngram = "chat-head", "code-head", "ngram"
    prior = {chat: 0.58, code: 0.35, ngram: 0.45}
    centre = PromptCentre()
    models = (chat, code)
    for _ in range(20):
        centre.centred([{chat: (2.6, 24), code: (3.2, 24), ngram: (7.0, 24)}], prior, models)
    (row,) = centre.centred([{chat: (6.2, 24), code: (6.4, 24), ngram: (9.0, 24)}], prior, models)
    assert row[chat][0] / 24 == pytest.approx(0.58, abs=0.01)
    assert row[code][0] / 24 == pytest.approx(0.35, abs=0.01)
    assert row[ngram][0] / 24 > 0.45 + 0.05  # its own shift, not ranked with the heads
    (one,) = centre.centred([{chat: (2.6, 24), code: (9.0, 24)}], prior, models)
    assert one[code][0] / 24 > 0.35 + 0.1 and one[chat][0] / 24 < 0.58 - 0.1
    (alone,) = centre.centred([{chat: (9.0, 24)}], prior, models)  # one model drafter: its own shift
    assert alone[chat][0] / 24 > 0.58 + 0.1


def test_a_sequence_at_gamma_0_is_scored_within_a_share_of_the_step_time() -> None:
    """Every 8th γ = 0 step at least; where a score is dear against the plain step, or many
    sequences run γ = 0, less often, so the scores cost at most ``PLAIN_SCORE_SHARE`` of a
    plain step on average; each reads at most the last ``PLAIN_SCORE_MAX`` tokens."""
    every, share = plan.PLAIN_SCORE_EVERY, scoring.PLAIN_SCORE_SHARE
    assert scoring.plain_score_every(1, None, 0.036) == every  # nothing measured yet
    assert scoring.plain_score_every(1, 0.004, 0.036) == every  # SmolLM2 fp32: 0.5 ms a step
    slow = scoring.plain_score_every(1, 0.001, 0.002)  # nj-target: a 1 ms score on a 2 ms step
    assert slow == 25 and 0.001 / slow <= share * 0.002
    assert scoring.plain_score_every(16, 0.001, 0.002) == 16 * 25  # 16 sequences at γ = 0
    spec = SeqSpec()
    due = [spec.plain_step(every) for _ in range(3 * every)]
    assert due == ([0] * (every - 1) + [every]) * 3  # the tokens since the last score, then 0 again
    due = [spec.plain_step(slow) for _ in range(2 * slow)]
    assert due == ([0] * (slow - 1) + [plan.PLAIN_SCORE_MAX]) * 2


def test_the_prompt_picks_each_requests_drafter_on_its_first_decode_step_and_output_is_exact() -> None:
    engine = nj_engine()
    prompts = {f"code-{i}": p for i, p in enumerate(CODE_PROMPTS)} | {
        f"story-{i}": p for i, p in enumerate(STORY_PROMPTS)
    }
    reference, _ = drain(engine, prompts, PLAIN)
    got, seen = drain(engine, prompts, rule_decision(version=2))
    assert got == reference  # the target's output alone, token for token
    for rid, name in seen["first"].items():
        assert name == (CODE if rid.startswith("code") else PROSE), seen["first"]
    steps = seen["steps"]
    assert sum(s.prompts_scored for s in steps) == len(prompts)
    assert any(s.drafter_shares.get(CODE) and s.drafter_shares.get(PROSE) for s in steps)  # both in one step
    assert sum(s.accepted for s in steps) > 0


def test_a_drafter_failing_on_a_prompt_costs_no_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """Prompt scoring runs drafter forwards before the step's isolated phases: a drafter that
    raises there resets the drafters, the sequences start from the prior, and the output is
    the target's alone."""
    engine = nj_engine()
    prompts = {f"code-{i}": p for i, p in enumerate(CODE_PROMPTS)}
    reference, _ = drain(engine, prompts, PLAIN)

    def broken(self: DrafterPool, seqs: list, starts: list, names: object = None) -> list:  # type: ignore[type-arg]
        raise RuntimeError("a drafter bug")

    monkeypatch.setattr(DrafterPool, "prompt_hits", broken)
    got, seen = drain(engine, prompts, rule_decision(version=2))
    assert got == reference
    assert sum(s.prompts_scored for s in seen["steps"]) == len(prompts)


def test_a_sequence_at_gamma_0_learns_the_model_drafters_from_its_own_output(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The drafters' prior is 0.05 (by E(α, γ) none pays): a story runs γ = 0, verifies
    nothing, and would learn nothing about the prose drafter. Every ``PLAIN_SCORE_EVERY``-th
    γ = 0 step scores the model drafters on its last tokens (the step reports them as its
    counterfactual, for the planner): the story finds the prose drafter pays and drafts with
    it, exactly; without those scores it never speculates."""
    story = {"story": STORY_PROMPTS[0]}
    decision = rule_decision(version=2, skip_drafters=["ngram"]).model_copy(
        update={"acceptance": dict.fromkeys(DRAFTERS, 0.05)}
    )
    engine = nj_engine()
    reference, _ = drain(engine, story, PLAIN)
    got, seen = drain(engine, story, decision)
    assert got == reference
    steps = seen["steps"]
    scored = [s for s in steps if s.gamma == 0 and s.counterfactual]
    assert scored and all(set(s.counterfactual) == {CODE, PROSE} for s in scored)
    assert all(s.counterfactual_time > 0 for s in scored)
    prose = [s for s in steps if s.drafter_shares.get(PROSE)]
    assert prose and sum(s.accepted for s in prose) > 0
    monkeypatch.setattr(scoring, "PLAIN_SCORE_EVERY", 10**9)
    got, seen = drain(engine, story, decision.model_copy(update={"version": 3}))
    assert got == reference and not any(s.drafter_shares for s in seen["steps"])
