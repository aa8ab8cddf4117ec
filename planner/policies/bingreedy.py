"""One bucket's bandit over γ: blocks of doubling length split into bins, one arm per bin.

Time counts the decoding steps observed in this bucket. Block j lasts H_j = 2^(j−1) steps and
is cut into bins of max(1, ⌊√H_j⌋) steps. At each bin start a coin decides whether the bin
explores (a uniformly random γ among those still ``plausible``) or exploits (the argmin of
the empirical loss plus the switching cost, see ``greedy``); the arm then stays fixed for the
whole bin, which bounds how often γ can change. The coin's probability is 1/b with b the bucket's bin counter
(``paper``), 1/√b with b the bin's index within its block (``fork``, the authors' code), or
1/b with b the index within the block (``per-block``).

With a prior (``intervals``: each arm's predicted loss and its interval, from the startup
cost profile, see prior.py) an arm nothing is known of is still tried first, exploitation is
the argmin of the interval means (plus the switching cost), and an exploration bin draws only
among the arms whose interval overlaps the best one's: where the prediction separates the
arms, the coin explores nothing and the bin exploits (counted in ``explore_bins`` otherwise).

Feedback is delayed, so a bin ends once ``length`` steps have *run with its arm* (steps of
the previous arm still in flight do not count), or once ``length + slack`` steps that could
have run it have been seen whatever γ they used (the worker may never run it, e.g. while it
falls back to its own rule).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from planner.policies.signals import Draws

EXPLORE_RULES = ("paper", "fork", "per-block")
Z = 3.0  # width of the confidence bounds that retire an arm from exploration
MIN_SAMPLES = 8  # an arm with fewer steps is always still plausible


@dataclass(frozen=True)
class Interval:
    """An arm's loss: its best estimate and the interval it lies in. ``paired`` holds the
    loss under each of a few shared scenarios (e.g. the acceptance at its lower bound, mean
    and upper bound), each known to a relative ``rel``: two arms with scenarios are compared
    scenario by scenario, since what they share moves both alike."""

    mean: float
    lo: float
    hi: float
    paired: tuple[float, ...] = ()
    rel: float = 0.0

    def scaled(self, k: float, rel: float | None = None) -> Interval:
        rel = self.rel if rel is None else rel
        paired = tuple(x * k for x in self.paired)
        lo, hi = (min(paired) * (1 - rel), max(paired) * (1 + rel)) if paired else (self.lo * k, self.hi * k)
        return Interval(self.mean * k, lo, hi, paired, rel)

    def beats(self, other: Interval) -> bool:
        """Surely a lower loss than ``other``: in every shared scenario, or else entirely."""
        if self.paired and len(self.paired) == len(other.paired):
            return all(
                x * (1 + self.rel) < y * (1 - other.rel)
                for x, y in zip(self.paired, other.paired, strict=True)
            )
        return self.hi < other.lo


class BinGreedy:
    """Blocks, bins, and per-arm empirical mean loss for one context bucket."""

    def __init__(self, n_arms: int, explore_rule: str = "per-block", slack: int = 32) -> None:
        if explore_rule not in EXPLORE_RULES:
            raise ValueError(f"explore rule must be one of {EXPLORE_RULES}, got {explore_rule!r}")
        self.n_arms = n_arms
        self.explore_rule = explore_rule
        self.slack = slack
        self.block = 1
        self.bin = 0  # index within the block, from 1 once the first bin starts
        self.bins_total = 0  # bins started in this bucket, ever
        self.arm = 0
        self.explore = False
        self.coin = False  # the open bin's exploration coin
        self.explore_bins = 0  # bins that explored, ever
        self.matched = 0  # steps of this bin that ran with self.arm
        self.seen = 0  # steps of this bin that could have run it
        self.counts = [0] * n_arms
        self.seconds = [0.0] * n_arms  # per-sequence step time, summed
        self.tokens = [0.0] * n_arms  # tokens per sequence, summed
        self.ratio_sum = [0.0] * n_arms  # per-step latency per token, and its square, summed:
        self.ratio_sq = [0.0] * n_arms  # the spread of single steps, for confidence bounds

    @property
    def block_steps(self) -> int:
        return 1 << (self.block - 1)

    @property
    def bin_length(self) -> int:
        return max(1, math.isqrt(self.block_steps))

    @property
    def bins_per_block(self) -> int:
        return -(-self.block_steps // self.bin_length)

    def record(self, arm: int, seconds: float, tokens: float) -> None:
        """One step that ran with ``arm``: its time and the tokens each sequence got."""
        self.counts[arm] += 1
        self.seconds[arm] += seconds
        self.tokens[arm] += tokens
        r = seconds / tokens if tokens > 0 else 0.0
        self.ratio_sum[arm] += r
        self.ratio_sq[arm] += r * r

    @property
    def means(self) -> list[float]:
        """Empirical latency per token of each arm: Σ time / Σ tokens (a ratio of sums, since
        the mean of per-step ratios overstates arms whose token count varies, by Jensen)."""
        return [s / t if t > 0 else 0.0 for s, t in zip(self.seconds, self.tokens, strict=True)]

    def tick(self, ran: int, could_run: bool) -> bool:
        """Count one step of this bucket; True when the current bin is over."""
        if ran == self.arm:
            self.matched += 1
        if could_run:
            self.seen += 1
        return self.matched >= self.bin_length or self.seen >= self.bin_length + self.slack

    def stderr(self, arm: int) -> float:
        """Standard error of an arm's mean loss, from the spread of its single steps."""
        n = self.counts[arm]
        if n < 2:
            return math.inf
        mean = self.ratio_sum[arm] / n
        var = max(self.ratio_sq[arm] / n - mean * mean, 0.0)
        return math.sqrt(var / (n - 1))

    def plausible(self) -> list[int]:
        """Arms not yet shown worse than the best (mean − Z·se above the best's mean + Z·se):
        exploration draws among these only, so a γ that is clearly bad stops being tried."""
        means = self.means
        tried = [a for a in range(self.n_arms) if self.counts[a] >= MIN_SAMPLES]
        if not tried:
            return list(range(self.n_arms))
        best = min(tried, key=lambda a: means[a])
        bar = means[best] + Z * self.stderr(best)
        return [
            a
            for a in range(self.n_arms)
            if self.counts[a] < MIN_SAMPLES or means[a] - Z * self.stderr(a) <= bar
        ]

    def greedy(self, switch_now: float = 0.0, switch_on: float = 0.0, switch_off: float = 0.0) -> int:
        """Untried arms first (lowest γ), else the arm with the least expected loss per step.

        Over the bin's n steps the switch term 1[γ_prev = 0 ∧ γ > 0]·C_switch/γ is paid at the
        bin's start if speculation is off now (``switch_now`` = C_switch then, else 0), and at
        every entry into this bucket from one running γ = 0 (``switch_on`` = such entries per
        step × C_switch); running γ = 0 here makes the buckets that load moves on to pay it
        (``switch_off`` = that cost per step). Per step: ℓ(0) + switch_off for γ = 0, and
        ℓ(γ) + (switch_now/n + switch_on)/γ for γ > 0.
        """
        for arm in range(self.n_arms):
            if self.counts[arm] == 0:
                return arm
        n = self.bin_length
        extra = [switch_off] + [(switch_now / n + switch_on) / a for a in range(1, self.n_arms)]
        scores = [m + e for m, e in zip(self.means, extra, strict=True)]
        return min(range(self.n_arms), key=lambda a: (scores[a], a))

    def overlapping(self, intervals: Sequence[Interval | None]) -> tuple[int, list[int]]:
        """The arm with the least mean loss (unknown arms first, lowest γ), and the arms
        whose interval overlaps its interval (unknown arms always)."""
        unknown = [a for a, iv in enumerate(intervals) if iv is None]
        known = {a: iv for a, iv in enumerate(intervals) if iv is not None}
        if not known:
            return unknown[0], unknown
        best = min(known, key=lambda a: (known[a].mean, a))
        top = known[best]
        return (unknown[0] if unknown else best), [
            a for a, iv in enumerate(intervals) if iv is None or not top.beats(iv)
        ]

    def prior_greedy(self, intervals: list[Interval | None], switch: tuple[float, float, float]) -> int:
        """``greedy`` on the interval means: unknown arms first, else the least loss per step."""
        unknown = [a for a, iv in enumerate(intervals) if iv is None]
        if unknown:
            return unknown[0]
        now, on, off = switch
        n = self.bin_length
        scores = [iv.mean + (off if a == 0 else (now / n + on) / a) for a, iv in enumerate(intervals) if iv]
        return min(range(self.n_arms), key=lambda a: (scores[a], a))

    def start_bin(
        self,
        draws: Draws,
        switch: tuple[float, float, float] = (0.0, 0.0, 0.0),
        intervals: list[Interval | None] | None = None,
    ) -> int:
        """Open the next bin (and block, when this one is used up); returns its arm. With
        ``intervals`` (one per arm, None: unknown) exploration is limited to the arms that
        overlap the best (see the module docstring)."""
        self.bin += 1
        if self.bin > self.bins_per_block:
            self.block += 1
            self.bin = 1
        self.bins_total += 1
        if self.explore_rule == "paper":
            p = 1.0 / self.bins_total
        elif self.explore_rule == "fork":
            p = 1.0 / math.sqrt(self.bin)
        else:
            p = 1.0 / self.bin
        self.coin = draws.uniform() < p
        self.matched = 0
        self.seen = 0
        return self._choose(draws, switch, intervals)

    def rechoose(
        self, draws: Draws, switch: tuple[float, float, float], intervals: list[Interval | None] | None
    ) -> int:
        """Choose the open bin's arm again (a prior arrived after it opened), with its coin,
        unless a step has already counted in it."""
        if self.matched or self.seen:
            return self.arm
        self.explore_bins -= int(self.explore)
        return self._choose(draws, switch, intervals)

    def _choose(
        self, draws: Draws, switch: tuple[float, float, float], intervals: list[Interval | None] | None
    ) -> int:
        self.explore = self.coin
        if intervals is not None:
            arms = self.overlapping(intervals)[1]
            self.explore = self.explore and len(arms) > 1
            if not self.explore:
                self.arm = self.prior_greedy(intervals, switch)
        elif self.explore:
            arms = self.plausible()
        else:
            self.arm = self.greedy(*switch)
        if self.explore:
            self.arm = arms[min(int(draws.uniform() * len(arms)), len(arms) - 1)]
            self.explore_bins += 1
        return self.arm

    def best(self) -> int:
        """The arm with the lowest mean loss among those tried (0 if none)."""
        tried = [a for a in range(self.n_arms) if self.counts[a] > 0]
        means = self.means
        return min(tried, key=lambda a: (means[a], a)) if tried else 0

    def state_dict(self) -> dict[str, Any]:
        return {
            "block": self.block, "bin": self.bin, "bins_total": self.bins_total, "arm": self.arm,
            "explore": self.explore, "explore_bins": self.explore_bins, "coin": self.coin,
            "matched": self.matched, "seen": self.seen,
            "counts": list(self.counts), "seconds": list(self.seconds), "tokens": list(self.tokens),
            "ratio_sum": list(self.ratio_sum), "ratio_sq": list(self.ratio_sq),
        }  # fmt: skip

    def load_state_dict(self, s: dict[str, Any]) -> None:
        if len(s["counts"]) != self.n_arms:
            raise ValueError(f"saved bandit has {len(s['counts'])} arms, this one {self.n_arms}")
        self.block, self.bin, self.arm = int(s["block"]), int(s["bin"]), int(s["arm"])
        self.bins_total = int(s["bins_total"])
        self.explore = bool(s["explore"])
        self.explore_bins = int(s.get("explore_bins", 0))
        self.coin = bool(s.get("coin", self.explore))
        self.matched, self.seen = int(s["matched"]), int(s["seen"])
        self.counts = [int(c) for c in s["counts"]]
        self.seconds = [float(x) for x in s["seconds"]]
        self.tokens = [float(x) for x in s["tokens"]]
        self.ratio_sum = [float(x) for x in s["ratio_sum"]]
        self.ratio_sq = [float(x) for x in s["ratio_sq"]]
