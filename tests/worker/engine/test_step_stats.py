"""A step's ``StepStats`` from its phases' records alone (step_stats.py)."""

from __future__ import annotations

import torch

from shared.control import MemoryEvent, SwitchCostEvent
from shared.schemas import SamplingParams
from worker.engine.records import Candidate, Drafted, DraftRound, StepWork, Verified
from worker.engine.scheduler import Scheduled, SchedulerOutput
from worker.engine.sequence import Sequence
from worker.engine.spec.speculator import Feedback, SpecChoice
from worker.engine.step_stats import EngineState, StepRecord, step_stats


def _verified(name: str, prefill: bool, emitted: list[int], drafted: Drafted | None = None) -> Verified:
    seq = Sequence(name, [1, 2, 3, 4], SamplingParams())
    seq.prefilling = prefill
    rows = torch.zeros(len(emitted), 8)
    return Verified(
        Candidate(Scheduled(seq, 4 if prefill else 1), rows, [0] * len(emitted), drafted), emitted, None
    )


def _record(work: StepWork, feedback: Feedback, choice: SpecChoice) -> StepRecord:
    preempted = [Sequence("p", [1, 2], SamplingParams())]
    state = EngineState(
        step_time=0.05,
        contexts=[10, 20, 30],
        waiting=2,
        free_blocks=5,
        total_blocks=64,
        prefix_queries=3,
        prefix_hits=1,
        draft_resident=False,
        plan_version=9,
    )
    event = MemoryEvent(kind="kv_resize", seconds=0.001, from_blocks=64, to_blocks=80)
    return StepRecord(7, choice, SchedulerOutput(preempted=preempted), work, feedback, [event], state)


def test_a_speculative_step() -> None:
    d = Drafted(start=4, tokens=[5, 6, 7], q=None, requested=3, drafter="ngram")
    switch = SwitchCostEvent(drafter="ngram", batch_size=1, tokens=4, seconds=0.002)
    round_ = DraftRound({"a": d}, "ngram", {"ngram": 1}, [switch], seconds=0.01)
    verified = [_verified("a", False, [5, 6, 9], d), _verified("b", True, [3])]
    work = StepWork(round_, verified, kept=4, prefilled=4, verify_time=0.03)
    feedback = Feedback(accepted=2, counterfactual={"copy": 0.5}, seconds=0.004, drafts=1, per_pos=[1, 1, 0])
    choice = SpecChoice(gamma=3, prompt_seconds=0.001, prompts_scored=1)
    stats = step_stats(_record(work, feedback, choice))
    assert (stats.step, stats.batch_size, stats.prefill_tokens, stats.num_tokens) == (7, 1, 4, 4)
    assert (stats.gamma, stats.drafter, stats.drafter_shares, stats.proposed) == (3, "ngram", {"ngram": 1}, 3)
    assert stats.step_time == 0.05 and stats.draft_time == 0.01 and stats.verify_time == 0.03
    assert abs(stats.other_time - 0.01) < 1e-12
    assert abs(stats.counterfactual_time - 0.005) < 1e-12 and stats.prompts_scored == 1
    assert (stats.accepted, stats.num_drafts, stats.accepted_per_pos) == (2, 1, [1, 1, 0])
    assert stats.counterfactual == {"copy": 0.5} and stats.switch_costs == [switch]
    assert (stats.mean_context, stats.running, stats.waiting) == (20.0, 3, 2)
    assert (stats.free_blocks, stats.total_blocks, stats.draft_resident) == (5, 64, False)
    assert (stats.prefix_queries, stats.prefix_hits, stats.preempted, stats.failed) == (3, 1, 1, 0)
    assert stats.decision_version == 9 and [e.kind for e in stats.memory_events] == ["kv_resize"]


def test_a_step_that_drafted_nothing_reports_gamma_zero() -> None:
    """γ was chosen but no sequence had room for a draft: the step ran γ = 0."""
    work = StepWork(DraftRound(), [_verified("a", False, [5])], kept=1)
    stats = step_stats(_record(work, Feedback(), SpecChoice(gamma=2)))
    assert stats.gamma == 0 and stats.drafter is None and stats.proposed == 0 and stats.batch_size == 1


def test_a_failed_step() -> None:
    failed = [Sequence("x", [1, 2], SamplingParams())]
    stats = step_stats(_record(StepWork(failed=failed), Feedback(), SpecChoice()))
    assert stats.failed == 1 and stats.num_tokens == 0 and stats.batch_size == 0
    assert stats.other_time == stats.step_time  # nothing drafted or verified


def test_an_empty_engine_has_no_mean_context() -> None:
    r = _record(StepWork(), Feedback(), SpecChoice())
    empty = StepRecord(
        r.step, r.choice, SchedulerOutput(), r.work, r.feedback, [], EngineState(step_time=0.0)
    )
    stats = step_stats(empty)
    assert stats.mean_context == 0.0 and stats.running == 0 and stats.preempted == 0
