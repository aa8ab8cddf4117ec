"""The engine's door for the planner: what to speculate, as one typed, frozen record.

The worker (worker/speculation.py) builds a ``SpeculationPlan`` from each planner decision and
hands it to the engine with ``Engine.apply_plan``; nothing under worker/engine/ sees the
planner's message itself. The plan holds exactly what the engine reads:

- γ per batch bucket (``gamma_table``, ``gamma_for``) and the drafter for all (``drafter``)
  or, in per-request scope, each sequence's own learner over the drafters (``drafter_scope``,
  ``request_learner``, ``request_discount``, ``drafter_costs``: spec/router.py);
- the cost rule's inputs (``step_costs``, ``acceptance``, ``acceptance_hi``, ``hold_steps``,
  ``hold_by_drafter``, ``hold_tokens``:
  spec/plan.py ``CostRule``); with step costs the cost rule decides and the γ table only
  describes;
- which drafters to score (``score_drafters``) and which to leave out (``skip_drafters``);
- whether the drafters go out of memory (``offload``: spec/memory.py);
- the version, for telemetry (``StepStats.decision_version``; 0: not the planner's).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from shared.control import ALL_BATCHES, StepCosts

DrafterScope = Literal["batch", "request"]
Learner = Literal["normalhedge", "hedge"]


@dataclass(frozen=True)
class SpeculationPlan:
    """What the engine speculates with from the next step on (see the module docstring).
    The default plan speculates nothing: γ = 0 at every batch size, drafters resident."""

    version: int = 0
    gamma_table: tuple[tuple[int, int], ...] = ((ALL_BATCHES, 0),)  # (largest batch of bucket, γ)
    drafter: str | None = None  # batch scope: everyone's; request scope: the learners' start
    drafter_scope: DrafterScope = "batch"
    request_learner: Learner = "normalhedge"
    request_discount: float = 1.0
    drafter_costs: Mapping[str, float] = field(default_factory=dict)  # draft step ÷ plain step
    score_drafters: bool = True  # every drafter's counterfactual acceptance on verified tokens
    skip_drafters: frozenset[str] = frozenset()  # dominated: neither scored nor chosen
    offload: bool = False
    step_costs: tuple[StepCosts, ...] = ()  # ascending batch sizes (empty: no cost rule)
    acceptance: Mapping[str, float] = field(default_factory=dict)  # per drafter, the prior mean
    acceptance_hi: Mapping[str, float] = field(default_factory=dict)  # its plausible highest
    hold_steps: int = 1
    hold_by_drafter: Mapping[str, int] = field(default_factory=dict)  # K to switch into it (else hold_steps)
    hold_tokens: int = 0  # the catch-up length that K is for: K scales with a drafter's lag (0: it does not)

    def gamma_for(self, batch_size: int) -> int:
        """γ of the bucket holding ``batch_size`` (the last bucket covers every larger batch)."""
        for upper, gamma in self.gamma_table:
            if batch_size <= upper:
                return gamma
        return self.gamma_table[-1][1] if self.gamma_table else 0
