"""One bucket's bandit over γ: blocks of doubling length split into bins, one arm per bin.

Time counts the decoding steps observed in this bucket. Block j lasts H_j = 2^(j−1) steps and
is cut into bins of max(1, ⌊√H_j⌋) steps. At each bin start a coin decides whether the bin
explores (a uniformly random γ) or exploits (the argmin of the empirical loss plus the
caller's switching penalty); the arm then stays fixed for the whole bin, which bounds how
often γ can change. The coin's probability is 1/b (``inverse-bin``, b = the bin's index
within its block, from 1) or the authors' fork 1/√b (``inverse-sqrt``).

Feedback is delayed, so a bin ends once ``length`` steps have *run with its arm* (steps of
the previous arm still in flight do not count), or once ``length + slack`` steps that could
have run it have been seen whatever γ they used (the worker may never run it, e.g. while it
falls back to its own rule).
"""

from __future__ import annotations

import math
from typing import Any

from planner.policies.signals import Draws

EXPLORE_RULES = ("inverse-bin", "inverse-sqrt")


class BinGreedy:
    """Blocks, bins, and per-arm empirical mean loss for one context bucket."""

    def __init__(self, n_arms: int, explore_rule: str = "inverse-bin", slack: int = 32) -> None:
        if explore_rule not in EXPLORE_RULES:
            raise ValueError(f"explore rule must be one of {EXPLORE_RULES}, got {explore_rule!r}")
        self.n_arms = n_arms
        self.explore_rule = explore_rule
        self.slack = slack
        self.block = 1
        self.bin = 0  # index within the block, from 1 once the first bin starts
        self.arm = 0
        self.explore = False
        self.matched = 0  # steps of this bin that ran with self.arm
        self.seen = 0  # steps of this bin that could have run it
        self.counts = [0] * n_arms
        self.means = [0.0] * n_arms

    @property
    def block_steps(self) -> int:
        return 1 << (self.block - 1)

    @property
    def bin_length(self) -> int:
        return max(1, math.isqrt(self.block_steps))

    @property
    def bins_per_block(self) -> int:
        return -(-self.block_steps // self.bin_length)

    def record(self, arm: int, loss: float) -> None:
        """One step's loss for the arm it actually ran with."""
        self.counts[arm] += 1
        self.means[arm] += (loss - self.means[arm]) / self.counts[arm]

    def tick(self, ran: int, could_run: bool) -> bool:
        """Count one step of this bucket; True when the current bin is over."""
        if ran == self.arm:
            self.matched += 1
        if could_run:
            self.seen += 1
        return self.matched >= self.bin_length or self.seen >= self.bin_length + self.slack

    def greedy(self, penalty: list[float]) -> int:
        """Untried arms first (lowest γ), else argmin of mean loss + penalty."""
        for arm in range(self.n_arms):
            if self.counts[arm] == 0:
                return arm
        scores = [m + p for m, p in zip(self.means, penalty, strict=True)]
        return min(range(self.n_arms), key=lambda a: (scores[a], a))

    def start_bin(self, draws: Draws, penalty: list[float]) -> int:
        """Open the next bin (and block, when this one is used up); returns its arm."""
        self.bin += 1
        if self.bin > self.bins_per_block:
            self.block += 1
            self.bin = 1
        p = 1.0 / self.bin if self.explore_rule == "inverse-bin" else 1.0 / math.sqrt(self.bin)
        self.explore = draws.uniform() < p
        if self.explore:
            self.arm = min(int(draws.uniform() * self.n_arms), self.n_arms - 1)
        else:
            self.arm = self.greedy(penalty)
        self.matched = 0
        self.seen = 0
        return self.arm

    def best(self) -> int:
        """The arm with the lowest mean loss among those tried (0 if none)."""
        tried = [a for a in range(self.n_arms) if self.counts[a] > 0]
        return min(tried, key=lambda a: (self.means[a], a)) if tried else 0

    def state_dict(self) -> dict[str, Any]:
        return {
            "block": self.block, "bin": self.bin, "arm": self.arm, "explore": self.explore,
            "matched": self.matched, "seen": self.seen,
            "counts": list(self.counts), "means": list(self.means),
        }  # fmt: skip

    def load_state_dict(self, s: dict[str, Any]) -> None:
        if len(s["counts"]) != self.n_arms:
            raise ValueError(f"saved bandit has {len(s['counts'])} arms, this one {self.n_arms}")
        self.block, self.bin, self.arm = int(s["block"]), int(s["bin"]), int(s["arm"])
        self.explore = bool(s["explore"])
        self.matched, self.seen = int(s["matched"]), int(s["seen"])
        self.counts = [int(c) for c in s["counts"]]
        self.means = [float(m) for m in s["means"]]
