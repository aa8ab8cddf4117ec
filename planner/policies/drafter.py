"""Drafter choice from counterfactual acceptance (HedgeSpec), shared by ``hedge`` and ``nightjar``.

Every step's telemetry carries, for every drafter, the acceptance rate it would have had on
the tokens the target just verified (Telemetry.counterfactual); the loss of drafter i is
1 − acceptance. The problem is full-information, so the choice needs no exploration: feedback
about every drafter arrives whichever one ran. Feedback is delayed and may come from several
workers out of order, so it is queued on arrival and applied sorted by (timestamp, worker,
step) at the next decision, while decisions in between act on the current weights.

With ``scope="request"`` (the default) the published drafter is each new request's prior:
every sequence then follows its own learner on its own counterfactual feedback in the
worker (worker/engine/spec/router.py), HedgeSpec's per-query guarantee.

The published drafter is the highest-weight one (``select="argmax"``), kept unless another
leads it by more than ``margin``: a drafter switch costs the new drafter a catch-up, and
with full information randomising buys nothing. ``select="sample"`` draws from the weights
as the theory's randomised learner does.
"""

from __future__ import annotations

from typing import Any

from planner.policies.signals import Draws, is_step
from shared.control import Telemetry
from shared.experts import LEARNERS, ExpertLearner, drafter_speed
from shared.policy_params import Param, float_param, str_param

SCOPES = ("request", "batch")  # Decision.drafter_scope

HEDGE_PARAMS: dict[str, Param] = {
    "learner": str_param("normalhedge", "expert learner over drafters", LEARNERS),
    "discount": float_param(0.98, "per-round forgetting factor λ (1 = never forget)", 0.5, 1.0),
    "select": str_param("argmax", "publish the top drafter or sample from the weights", ("argmax", "sample")),
    "margin": float_param(0.05, "weight lead another drafter needs to displace the current one", 0.0, 1.0),
    "drafters": str_param(None, "comma-separated drafters to choose among (None: every drafter reported)"),
    "scope": str_param(
        "request",
        "request: each sequence its own learner, from the published drafter; batch: all draft with it",
        SCOPES,
    ),
}


class DrafterChooser:
    """Queues counterfactual acceptance, feeds an ExpertLearner in order, picks a drafter."""

    def __init__(
        self,
        learner: str = "normalhedge",
        discount: float = 0.98,
        select: str = "argmax",
        margin: float = 0.05,
        drafters: str | None = None,
        seed: int = 0,
        scope: str = "request",
    ) -> None:
        self.learner = ExpertLearner(learner, discount)
        self.scope = scope  # published as Decision.drafter_scope
        self.select = select
        self.margin = margin
        self.allowed = {d.strip() for d in drafters.split(",") if d.strip()} if drafters else None
        self.draws = Draws(seed)
        self.queue: list[list[Any]] = []  # [ts, worker, step, {drafter: loss}]
        self.current: str | None = None
        self.rounds = 0

    def observe(self, t: Telemetry, costs: dict[str, float] | None = None) -> None:
        """Queue a step's counterfactual acceptance as losses: 1 − rate, or with ``costs``
        (each drafter's draft step over a plain target step) 1 − ``drafter_speed``."""
        if not is_step(t) or not t.counterfactual:
            return
        losses = {
            d: 1.0 - (drafter_speed(float(a), t.gamma, costs.get(d, 0.0)) if costs else float(a))
            for d, a in t.counterfactual.items()
            if self.allowed is None or d in self.allowed
        }
        if losses:
            self.queue.append([t.ts, t.worker_id, t.step, losses])

    def apply_feedback(self) -> None:
        """Apply every queued round, oldest first."""
        for _, _, _, losses in sorted(self.queue, key=lambda e: (e[0], e[1], e[2])):
            self.learner.update(losses)
            self.rounds += 1
        self.queue.clear()

    def choose(self) -> str | None:
        self.apply_feedback()
        weights = self.learner.weights()
        if not weights:
            return self.current
        if self.select == "sample":
            names = sorted(weights)
            self.current = names[self.draws.choice([weights[n] for n in names])]
            return self.current
        leader = max(sorted(weights), key=lambda n: weights[n])
        held = weights.get(self.current, -1.0) if self.current is not None else -1.0
        if held < 0 or weights[leader] > held + self.margin:
            self.current = leader
        return self.current

    def state_dict(self) -> dict[str, Any]:
        return {
            "learner": self.learner.state_dict(),
            "queue": [list(e) for e in self.queue],
            "current": self.current,
            "rounds": self.rounds,
            "draws": self.draws.state(),
        }

    def load_state_dict(self, s: dict[str, Any]) -> None:
        self.learner.load_state_dict(s["learner"])
        self.queue = [[float(e[0]), str(e[1]), int(e[2]), dict(e[3])] for e in s["queue"]]
        self.current = s["current"]
        self.rounds = int(s["rounds"])
        self.draws = Draws.from_state(s["draws"])
