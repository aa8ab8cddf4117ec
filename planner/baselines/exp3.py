"""``exp3``: EXP3Spec (BanditSpec, Alg. 5/9) over γ with no context — one γ for every batch size."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np

from planner.baselines.rewards import REWARDS, ArmRewards
from planner.policies.base import Choice, Policy
from planner.policies.signals import Draws, is_step
from shared.control import ALL_BATCHES, Telemetry
from shared.policy_params import Param, int_param, str_param


class Exp3Policy(Policy):
    """Exponential weights over γ ∈ {0..gamma_max} with importance-weighted losses:
    p_i ∝ exp(−η_t Σ Ẑ_i), η_t = sqrt(ln K / (t K)), Ẑ_i += (1 − r)/p_i for the arm that ran.

    Each decision samples γ; a step's feedback is weighted by the probability its γ had when
    it was last drawn (feedback arrives after later draws, so the current probability would
    be the wrong one).
    """

    PARAMS: ClassVar[dict[str, Param]] = {
        "gamma_max": int_param(4, "largest γ (arms 0..gamma_max)", 1, 16),
        "reward": str_param("goodput", "goodput (tokens/s) or latency (per-token, inverted)", REWARDS),
        "seed": int_param(0, "seed of the arm draws", 0),
        "drafter": str_param(None, "drafter to use (None: the worker's default)"),
    }

    def __init__(self, **params: Any) -> None:
        p = {k: spec.default for k, spec in self.PARAMS.items()} | params
        super().__init__(**p)
        self.k = p["gamma_max"] + 1
        self.drafter: str | None = p["drafter"]
        self.rewards = ArmRewards(self.k, p["reward"])
        self.draws = Draws(p["seed"])
        self.z = [0.0] * self.k  # importance-weighted cumulative loss
        self.drawn_p = [1.0 / self.k] * self.k  # probability of each arm when last drawn

    def probabilities(self) -> list[float]:
        t = max(self.rewards.total, 1)
        eta = math.sqrt(math.log(self.k) / (t * self.k))
        z = np.asarray(self.z)
        w = np.exp(-eta * (z - z.min()))
        return [float(x) for x in w / w.sum()]

    def observe(self, t: Telemetry) -> None:
        if is_step(t) and t.gamma < self.k:
            r = self.rewards.add(t.gamma, t)
            self.z[t.gamma] += (1.0 - r) / self.drawn_p[t.gamma]

    def decide(self, now: float) -> Choice:
        p = self.probabilities()
        gamma = self.draws.choice(p)
        self.drawn_p[gamma] = p[gamma]
        note = f"exp3 γ={gamma} p={p[gamma]:.2f}"
        return Choice(gamma_table=[(ALL_BATCHES, gamma)], drafter=self.drafter, note=note)

    def state_dict(self) -> dict[str, Any]:
        return {
            "rewards": self.rewards.state_dict(), "draws": self.draws.state(),
            "z": list(self.z), "drawn_p": list(self.drawn_p),
        }  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rewards.load_state_dict(state["rewards"])
        self.draws = Draws.from_state(state["draws"])
        self.z = [float(x) for x in state["z"]]
        self.drawn_p = [float(x) for x in state["drawn_p"]]
