"""``hedge``: HedgeSpec drafter choice — full-information NormalHedge (or Hedge) on the
counterfactual acceptance of every drafter — with a fixed γ or a simple acceptance rule."""

from __future__ import annotations

import math
from typing import Any, ClassVar

from planner.policies.base import Choice, Policy
from planner.policies.drafter import HEDGE_PARAMS, DrafterChooser
from planner.policies.signals import is_step
from shared.control import ALL_BATCHES, Telemetry
from shared.policy_params import Param, float_param, int_param, str_param

EWMA = 0.1  # weight of the newest step in each drafter's acceptance estimate


class HedgePolicy(Policy):
    """Pick the drafter with NormalHedge (default) or Hedge on loss 1 − acceptance.

    Every step's telemetry reports what each drafter's acceptance would have been on the
    tokens just verified; the learner forgets at rate ``discount`` so it follows a shift of
    domain. γ is ``gamma`` for every batch size, or with ``gamma_rule="acceptance"`` the
    longest run whose last draft token is still accepted with probability ≥
    ``gamma_threshold`` (α̂^γ ≥ threshold, α̂ the chosen drafter's smoothed acceptance),
    between 1 and ``gamma_max`` — never 0, so acceptance keeps being measured.
    """

    PARAMS: ClassVar[dict[str, Param]] = {
        **HEDGE_PARAMS,
        "gamma": int_param(3, "γ for every batch size (gamma_rule=fixed)", 0, 16),
        "gamma_rule": str_param("fixed", "fixed γ or γ from acceptance", ("fixed", "acceptance")),
        "gamma_max": int_param(6, "largest γ the acceptance rule may pick", 1, 16),
        "gamma_threshold": float_param(0.4, "acceptance rule: α̂^γ must stay at or above this", 0.01, 0.99),
        "seed": int_param(0, "seed for select=sample", 0),
    }

    def __init__(self, **params: Any) -> None:
        p = {k: spec.default for k, spec in self.PARAMS.items()} | params
        super().__init__(**p)
        self.chooser = DrafterChooser(
            p["learner"], p["discount"], p["select"], p["margin"], p["drafters"], p["seed"], p["scope"]
        )
        self.gamma: int = p["gamma"]
        self.rule: str = p["gamma_rule"]
        self.gamma_max: int = p["gamma_max"]
        self.threshold: float = p["gamma_threshold"]
        self.alpha: dict[str, float] = {}

    def observe(self, t: Telemetry) -> None:
        self.chooser.observe(t)
        if is_step(t):
            for name, a in t.counterfactual.items():
                prev = self.alpha.get(name)
                self.alpha[name] = float(a) if prev is None else prev + EWMA * (float(a) - prev)

    def rule_gamma(self, drafter: str | None) -> int:
        alpha = self.alpha.get(drafter) if drafter is not None else None
        if self.rule == "fixed" or alpha is None:
            return self.gamma
        if alpha <= 0.0:
            return 1
        if alpha >= 1.0:
            return self.gamma_max
        return max(1, min(self.gamma_max, int(math.log(self.threshold) / math.log(alpha))))

    def decide(self, now: float) -> Choice:
        drafter = self.chooser.choose()
        gamma = self.rule_gamma(drafter)
        weights = self.chooser.learner.weights()
        return Choice(
            gamma_table=[(ALL_BATCHES, gamma)],
            drafter=drafter,
            drafter_scope=self.chooser.scope,
            score_drafters=True,
            note=f"hedge drafter={drafter} γ={gamma}",
            extra={"weights": weights},
        )

    def state_dict(self) -> dict[str, Any]:
        return {"chooser": self.chooser.state_dict(), "alpha": dict(self.alpha)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.chooser.load_state_dict(state["chooser"])
        self.alpha = {str(k): float(v) for k, v in state["alpha"].items()}
