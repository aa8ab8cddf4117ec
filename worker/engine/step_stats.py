"""One step's ``StepStats``, built from the records its phases returned.

``LLMEngine.step`` (engine.py) gathers what each phase returned into a ``StepRecord`` — the
speculation choice, the schedule, the draft → forward → verify → commit work, the drafters'
feedback, the memory events — and what the engine looked like when the step ended
(``EngineState``); ``step_stats`` turns that into the telemetry record, reading nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shared.control import MemoryEvent, StepStats
from worker.engine.records import StepWork
from worker.engine.scheduler import SchedulerOutput
from worker.engine.spec.speculator import Feedback, SpecChoice


@dataclass(frozen=True)
class EngineState:
    """The engine at the end of a step (and this step's prefix-cache lookups)."""

    step_time: float  # seconds since the step began
    contexts: list[int] = field(default_factory=list)  # tokens of each running sequence
    waiting: int = 0
    free_blocks: int = 0
    total_blocks: int = 0
    prefix_queries: int = 0  # this step's
    prefix_hits: int = 0  # this step's
    draft_resident: bool = True
    plan_version: int = 0  # the speculation plan's (0: none, or not the planner's)


@dataclass(frozen=True)
class StepRecord:
    """What one step's phases returned, in order."""

    step: int
    choice: SpecChoice
    schedule: SchedulerOutput
    work: StepWork
    feedback: Feedback
    memory_events: list[MemoryEvent]
    state: EngineState


def step_stats(r: StepRecord) -> StepStats:
    """The step's telemetry: sizes, times, speculation and memory, from its records alone.

    Built from one part per topic below; ``StepStats`` (a pydantic model that forbids extra
    fields) validates every name and value the parts give it."""
    return StepStats(step=r.step, **_sizes(r), **_times(r), **_speculation(r), **_engine(r))


def _sizes(r: StepRecord) -> dict[str, Any]:
    """How many sequences and tokens the step dealt with."""
    work = r.work
    return {
        "batch_size": sum(1 for v in work.verified if not v.candidate.scheduled.prefill),
        "prefill_tokens": work.prefilled,
        "num_tokens": work.kept,
        "preempted": len(r.schedule.preempted),
        "failed": len(work.failed),
    }


def _times(r: StepRecord) -> dict[str, Any]:
    """Where the step's seconds went ("other": all but drafting and the verify phase)."""
    step_time, drafting, verifying = r.state.step_time, r.work.drafted.seconds, r.work.verify_time
    return {
        "step_time": step_time,
        "draft_time": drafting,
        "verify_time": verifying,
        "other_time": step_time - verifying - drafting,
        "counterfactual_time": r.feedback.seconds + r.choice.prompt_seconds,
    }


def _speculation(r: StepRecord) -> dict[str, Any]:
    """What was drafted (γ is 0 where nothing was) and what the drafters' feedback says."""
    drafted, fb = r.work.drafted, r.feedback
    return {
        "gamma": r.choice.gamma if drafted.drafts else 0,
        "drafter": drafted.drafter,
        "drafter_shares": drafted.shares,
        "switch_costs": drafted.switch_costs,
        "prompts_scored": r.choice.prompts_scored,
        "proposed": drafted.proposed,
        "accepted": fb.accepted,
        "num_drafts": fb.drafts,
        "accepted_per_pos": fb.per_pos,
        "counterfactual": fb.counterfactual,
        "lookahead": fb.lookahead,
    }


def _engine(r: StepRecord) -> dict[str, Any]:
    """The engine as the step ended: its sequences, its KV pool and memory, the plan in force."""
    state, contexts = r.state, r.state.contexts
    return {
        "mean_context": sum(contexts) / len(contexts) if contexts else 0.0,
        "running": len(contexts),
        "waiting": state.waiting,
        "free_blocks": state.free_blocks,
        "total_blocks": state.total_blocks,
        "prefix_queries": state.prefix_queries,
        "prefix_hits": state.prefix_hits,
        "draft_resident": state.draft_resident,
        "memory_events": r.memory_events,
        "decision_version": state.plan_version,
    }
