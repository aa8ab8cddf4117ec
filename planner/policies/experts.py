"""Full-information expert learners for the drafter choice: NormalHedge and Hedge.

Both forget at rate ``discount`` per round (λ): past regrets / losses are multiplied by λ
before each new round is added, so the learner effectively looks at the last ~1/(1 − λ)
rounds and follows a shift of domain (a plain cumulative learner would need as many rounds
to unlearn as it had to learn). λ = 1 gives the textbook, stationary learners.
Experts may appear at any time (a drafter first seen in telemetry joins with neutral state).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

LEARNERS = ("normalhedge", "hedge")


def _normalhedge_weights(regret: np.ndarray) -> np.ndarray:
    """NormalHedge (Chaudhuri, Freund, Hsu 2009): w ∝ (R₊/c)·exp(R₊²/2c), mean exp(R₊²/2c) = e."""
    n = len(regret)
    pos = np.maximum(regret, 0.0)
    s = float(np.max(pos * pos)) if n else 0.0
    if s <= 0.0:
        return np.full(n, 1.0 / n)
    lo, hi = s / (2.0 * (1.0 + math.log(n))), s / 2.0  # the root lies between (see docs)
    for _ in range(60):
        c = 0.5 * (lo + hi)
        z = pos * pos / (2.0 * c)
        log_mean = float(np.max(z) + np.log(np.mean(np.exp(z - np.max(z)))))
        lo, hi = (c, hi) if log_mean > 1.0 else (lo, c)
    c = 0.5 * (lo + hi)
    z = pos * pos / (2.0 * c)
    with np.errstate(divide="ignore"):
        logw = np.where(pos > 0, np.log(np.maximum(pos, 1e-300)) - math.log(c) + z, -np.inf)
    w = np.exp(logw - np.max(logw))
    return w / w.sum()


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

    def _ensure(self, names: list[str]) -> None:
        for name in names:
            if name not in self.names:
                neutral = 0.0 if self.kind == "normalhedge" or not self.score else min(self.score)
                self.names.append(name)
                self.score.append(neutral)

    def weights(self) -> dict[str, float]:
        if not self.names:
            return {}
        s = np.asarray(self.score)
        if self.kind == "normalhedge":
            w = _normalhedge_weights(s)
        else:
            eta = math.sqrt(8.0 * math.log(max(len(s), 2)) / max(self.rounds, 1.0))
            w = np.exp(-eta * (s - s.min()))
            w /= w.sum()
        return dict(zip(self.names, (float(x) for x in w), strict=True))

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

    def state_dict(self) -> dict[str, Any]:
        return {"names": list(self.names), "score": list(self.score), "rounds": self.rounds}

    def load_state_dict(self, s: dict[str, Any]) -> None:
        self.names = [str(n) for n in s["names"]]
        self.score = [float(x) for x in s["score"]]
        self.rounds = float(s["rounds"])
