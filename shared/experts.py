"""Full-information expert learners (NormalHedge and Hedge): the planner's drafter choice for
the batch, and the worker's per-request drafter choice (worker/engine/spec/router.py); and
``drafter_speed``, the cost-aware loss both use when a drafter's cost is known.

Both forget at rate ``discount`` per round (λ): past regrets / losses are multiplied by λ
before each new round is added, so the learner effectively looks at the last ~1/(1 − λ)
rounds and follows a shift of domain (a plain cumulative learner would need as many rounds
to unlearn as it had to learn). λ = 1 gives the textbook, stationary learners.
Experts may appear at any time (a drafter first seen in telemetry joins with neutral state).
"""

from __future__ import annotations

import math
from typing import Any

LEARNERS = ("normalhedge", "hedge")
BISECTIONS = 40  # NormalHedge's c to a relative 2^-40 of its bracket


def _normalhedge_weights(regret: list[float]) -> list[float]:
    """NormalHedge (Chaudhuri, Freund, Hsu 2009): w ∝ (R₊/c)·exp(R₊²/2c), mean exp(R₊²/2c) = e."""
    n = len(regret)
    pos = [r if r > 0.0 else 0.0 for r in regret]
    sq = [p * p for p in pos]
    s = max(sq)
    if s <= 0.0:
        return [1.0 / n] * n
    # mean exp(R₊²/2c) = e has its root c in [s / (2(1 + ln n)), s / 2] (see docs/planner.md);
    # there every exponent R₊²/2c is at most 1 + ln n, so the sums below cannot overflow. The
    # worker runs this once per sequence per verification: plain sums, no log-sum-exp.
    lo, hi = s / (2.0 * (1.0 + math.log(n))), s / 2.0
    bar = n * math.e
    for _ in range(BISECTIONS):
        c = 0.5 * (lo + hi)
        k = 0.5 / c
        if sum([math.exp(x * k) for x in sq]) > bar:
            lo = c
        else:
            hi = c
    k = 1.0 / (lo + hi)  # 1 / 2c at the bracket's middle
    w = [p * math.exp(x * k) for p, x in zip(pos, sq, strict=True)]
    total = sum(w)
    return [x / total for x in w]


def expected_tokens(alpha: float, gamma: int) -> float:
    """E(α, γ) = (1 − α^(γ+1)) / (1 − α): tokens per sequence per step, bonus included."""
    return float(gamma + 1) if alpha >= 1.0 else (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def drafter_speed(rate: float, gamma: int, cost: float) -> float:
    """A drafter's speed in [0, 1], the loss of a cost-aware learner being 1 − it: the tokens a
    step of γ drafts gives at acceptance ``rate`` (E = (1 − rate^(γ+1))/(1 − rate)) per unit of
    time, a draft step costing ``cost`` plain target steps, over the most any drafter could give
    (every draft accepted, drafting free): E / ((γ + 1)(1 + γ·cost))."""
    gamma = max(gamma, 1)
    tokens = expected_tokens(min(max(rate, 0.0), 1.0), gamma)
    return tokens / ((gamma + 1) * (1.0 + gamma * max(cost, 0.0)))


class ExpertLearner:
    """Weights over named experts from full-information losses in [0, 1]."""

    def __init__(self, kind: str = "normalhedge", discount: float = 0.98) -> None:
        if kind not in LEARNERS:
            raise ValueError(f"learner must be one of {LEARNERS}, got {kind!r}")
        if not 0.0 < discount <= 1.0:
            raise ValueError(f"discount must be in (0, 1], got {discount}")
        self.kind = kind
        self.discount = discount
        self.names: list[str] = []
        self.score: list[float] = []  # NormalHedge: discounted regret; Hedge: discounted loss
        self.rounds = 0.0  # discounted round count (Hedge's anytime learning rate)
        self._weights: dict[str, float] | None = None  # cache, dropped on every change

    def _ensure(self, names: list[str]) -> None:
        for name in names:
            if name not in self.names:
                neutral = 0.0 if self.kind == "normalhedge" or not self.score else min(self.score)
                self.names.append(name)
                self.score.append(neutral)
                self._weights = None

    def weights(self) -> dict[str, float]:
        if self._weights is None:
            self._weights = dict(zip(self.names, self._compute(), strict=True))
        return dict(self._weights)

    def _compute(self) -> list[float]:
        if not self.score:
            return []
        if self.kind == "normalhedge":
            return _normalhedge_weights(self.score)
        eta = math.sqrt(8.0 * math.log(max(len(self.score), 2)) / max(self.rounds, 1.0))
        low = min(self.score)
        w = [math.exp(-eta * (x - low)) for x in self.score]
        total = sum(w)
        return [x / total for x in w]

    def update(self, losses: dict[str, float]) -> None:
        """One round: ``losses`` maps expert → loss in [0, 1] (experts missing from it sit out)."""
        self._ensure(sorted(losses))
        w = self.weights()
        played = sum(w[n] for n in losses) or 1.0
        mean_loss = sum(w[n] * min(max(f, 0.0), 1.0) for n, f in losses.items()) / played
        for i, name in enumerate(self.names):
            if name in losses:
                f = min(max(losses[name], 0.0), 1.0)
                step = mean_loss - f if self.kind == "normalhedge" else f
                self.score[i] = self.discount * self.score[i] + step
        self.rounds = self.discount * self.rounds + 1.0
        self._weights = None

    def state_dict(self) -> dict[str, Any]:
        return {"names": list(self.names), "score": list(self.score), "rounds": self.rounds}

    def load_state_dict(self, s: dict[str, Any]) -> None:
        self.names = [str(n) for n in s["names"]]
        self.score = [float(x) for x in s["score"]]
        self.rounds = float(s["rounds"])
        self._weights = None
