"""The policy interface: observe telemetry, decide.

A policy is a small object with named parameters. The planner service feeds it every
telemetry message (feedback arrives delayed: a step's result reaches the policy after the
decision that caused it was published), asks it for a decision on a timer, persists its
learned state in Redis so a restarted planner carries on where it stopped, and hands it each
new startup cost profile the workers publish (``use_profile``; the profile is not state: the
planner reads it again when it starts).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from shared.control import StepCosts, Telemetry
from shared.policy_params import Param
from shared.profile import CostProfile


@dataclass
class Choice:
    """What a policy wants the workers to do; the planner wraps it in a versioned Decision."""

    gamma_table: list[tuple[int, int]]  # (largest batch size of the bucket, γ), ascending
    drafter: str | None = None
    drafter_scope: str = "batch"  # "request": each sequence its own learner (Decision.drafter_scope)
    # Whether the workers score every other drafter on the verified tokens (counterfactual
    # acceptance: HedgeSpec's full-information feedback). It costs a forward of each model
    # drafter per speculative step, so only a policy that learns from it asks for it.
    score_drafters: bool = False
    # Per drafter, a draft step over a plain target step (Decision.drafter_costs): what a
    # per-request learner weighs acceptance against. Empty: acceptance alone.
    drafter_costs: dict[str, float] = field(default_factory=dict)
    skip_drafters: list[str] = field(default_factory=list)  # dominated: not scored (Decision's)
    # The cost rule (Decision.step_costs and what goes with it; empty: gamma_table decides).
    step_costs: list[StepCosts] = field(default_factory=list)
    acceptance: dict[str, float] = field(default_factory=dict)
    acceptance_hi: dict[str, float] = field(default_factory=dict)
    hold_steps: int = 1
    hold_by_drafter: dict[str, int] = field(default_factory=dict)
    hold_tokens: int = 0  # the catch-up length hold_by_drafter's K is for (0: K whatever the lag)
    offload: bool = False
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


class Policy(ABC):
    """Base of every policy. Subclasses accept their parameters as keywords; a policy's name
    is its key in the registry (planner/policies/registry.py), nowhere else."""

    # Declared parameters (default, doc, parser); the registry validates against these.
    PARAMS: ClassVar[dict[str, Param]] = {}

    def __init__(self, **params: Any) -> None:
        self.params = params

    @abstractmethod
    def observe(self, t: Telemetry) -> None:
        """Take one telemetry message (a step, or an idle heartbeat) into account."""

    @abstractmethod
    def decide(self, now: float) -> Choice:
        """The decision to publish now."""

    def use_profile(self, profile: CostProfile) -> None:  # noqa: B027 - optional hook, ignored by default
        """Take a worker's startup cost profile (the planner hands over each new one) as the
        prior of what steps cost; policies that predict costs override this."""

    def state_dict(self) -> dict[str, Any]:
        """Learned state, msgpack-serialisable (persisted across planner restarts)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:  # noqa: B027 - optional hook, stateless default
        """Restore what ``state_dict`` returned."""
