"""``ucb``: UCBSpec (BanditSpec, Alg. 4/8) over γ with no context — one γ for every batch size."""

from __future__ import annotations

import math
from typing import Any, ClassVar

from planner.baselines.rewards import REWARDS, ArmRewards
from planner.policies.base import Choice, Policy
from planner.policies.signals import is_step
from shared.control import ALL_BATCHES, Telemetry
from shared.policy_params import Param, float_param, int_param, str_param


class UCBPolicy(Policy):
    """Upper confidence bound over γ ∈ {0..gamma_max}: each arm once, then
    argmax μ̂_i + cr_i with cr_i = ½·sqrt(((1+n_i)/n_i²)·(1 + 2 ln(K t² √(1+n_i) / δ))) —
    the paper's radius for rewards in [0, 1] (range L = 1, sub-Gaussian scale ½).
    Rewards: step goodput or inverse per-token latency, normalised by the best seen.
    """

    PARAMS: ClassVar[dict[str, Param]] = {
        "gamma_max": int_param(4, "largest γ (arms 0..gamma_max)", 1, 16),
        "delta": float_param(0.5, "confidence parameter δ (the paper's proof uses ½)", 1e-6, 1.0),
        "reward": str_param("goodput", "goodput (tokens/s) or latency (per-token, inverted)", REWARDS),
        "drafter": str_param(None, "drafter to use (None: the worker's default)"),
    }

    def __init__(self, **params: Any) -> None:
        p = {k: spec.default for k, spec in self.PARAMS.items()} | params
        super().__init__(**p)
        self.k = p["gamma_max"] + 1
        self.delta: float = p["delta"]
        self.drafter: str | None = p["drafter"]
        self.rewards = ArmRewards(self.k, p["reward"])

    def observe(self, t: Telemetry) -> None:
        if is_step(t) and t.gamma < self.k:
            self.rewards.add(t.gamma, t)

    def index(self, arm: int, t: int) -> float:
        n = self.rewards.counts[arm]
        log_term = math.log(self.k * t * t * math.sqrt(1 + n) / self.delta)
        return self.rewards.mean(arm) + 0.5 * math.sqrt((1 + n) / (n * n) * (1 + 2 * log_term))

    def choose(self) -> int:
        untried = [a for a in range(self.k) if self.rewards.counts[a] == 0]
        if untried:
            return untried[0]
        t = max(self.rewards.total, 1)
        return max(range(self.k), key=lambda a: (self.index(a, t), -a))

    def decide(self, now: float) -> Choice:
        gamma = self.choose()
        return Choice(gamma_table=[(ALL_BATCHES, gamma)], drafter=self.drafter, note=f"ucb γ={gamma}")

    def state_dict(self) -> dict[str, Any]:
        return {"rewards": self.rewards.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rewards.load_state_dict(state["rewards"])
