"""Step rewards in [0, 1] for the context-free bandit baselines (UCBSpec, EXP3Spec).

A step's raw reward is a rate: tokens per second of the whole step (``goodput``) or, per
sequence, tokens per second (``latency``: the inverse of the latency per token). Rates are
divided by the largest rate seen so far, so the best step observed scores 1; the scale only
moves when a new maximum appears. Per-arm sums of raw rates are kept, so means can be
re-normalised exactly whenever the maximum moves.
"""

from __future__ import annotations

from typing import Any

from planner.policies.signals import busy_time, goodput, tokens_per_sequence
from shared.control import Telemetry

REWARDS = ("goodput", "latency")


def raw_reward(t: Telemetry, kind: str) -> float:
    if kind == "goodput":
        return goodput(t)
    return tokens_per_sequence(t) / busy_time(t)


class ArmRewards:
    """Per-arm count and raw-rate sum, and the normaliser (largest rate seen)."""

    def __init__(self, n_arms: int, kind: str) -> None:
        if kind not in REWARDS:
            raise ValueError(f"reward must be one of {REWARDS}, got {kind!r}")
        self.kind = kind
        self.counts = [0] * n_arms
        self.sums = [0.0] * n_arms
        self.top = 0.0

    def add(self, arm: int, t: Telemetry) -> float:
        """Record a step of ``arm``; returns its normalised reward."""
        x = raw_reward(t, self.kind)
        self.top = max(self.top, x)
        self.counts[arm] += 1
        self.sums[arm] += x
        return x / self.top if self.top > 0 else 0.0

    def mean(self, arm: int) -> float:
        n = self.counts[arm]
        return self.sums[arm] / n / self.top if n and self.top > 0 else 0.0

    @property
    def total(self) -> int:
        return sum(self.counts)

    def state_dict(self) -> dict[str, Any]:
        return {"counts": list(self.counts), "sums": list(self.sums), "top": self.top}

    def load_state_dict(self, s: dict[str, Any]) -> None:
        if len(s["counts"]) != len(self.counts):
            raise ValueError(f"saved state has {len(s['counts'])} arms, this policy {len(self.counts)}")
        self.counts = [int(x) for x in s["counts"]]
        self.sums = [float(x) for x in s["sums"]]
        self.top = float(s["top"])
