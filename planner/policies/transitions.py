"""Where speculation gets switched back on: the bookkeeping behind Nightjar's switch term.

The loss of a step is ℓ(γ) + 1[γ_prev = 0 ∧ γ > 0]·C_switch/γ, where γ_prev is whatever the
worker ran on its previous step — often a step of another batch-size bucket. With one γ per
bucket, a switch happens whenever load moves from a bucket running γ = 0 into one running
γ > 0, so each bucket's choice changes the switches its neighbours pay. This keeps, from the
order in which each worker's steps fall into buckets: how often a step of bucket i follows
(or precedes) a step of bucket j (a transition matrix, halved every ``WINDOW`` steps so it
follows drifting load), how many steps a visit to each bucket lasts, and per worker whether
speculation is off right now and for how many tokens (capped by the sequences' context: the
draft never has more to catch up than the sequences hold).
"""

from __future__ import annotations

from typing import Any

WINDOW = 1024  # steps after which the counts are halved


class Transitions:
    """Bucket-to-bucket transition rates, visit lengths, and each worker's current off-run."""

    def __init__(self, n_buckets: int) -> None:
        self.n = n_buckets
        self.count = [[0.0] * n_buckets for _ in range(n_buckets)]  # [i][j]: steps i then j, i ≠ j
        self.steps = [0.0] * n_buckets
        self.dwell = [1.0] * n_buckets  # mean steps per visit (EWMA over visits)
        self.since_halving = 0
        # worker -> [last γ, γ = 0 run, mean context, last bucket, steps in this visit]
        self.workers: dict[str, list[float]] = {}

    def observe(self, worker: str, bucket: int, gamma: int, context: float) -> None:
        w = self.workers.get(worker)
        visit = 1.0
        if w is not None:
            prev = int(w[3])
            if prev != bucket:
                self.count[prev][bucket] += 1.0
                self.dwell[prev] += (w[4] - self.dwell[prev]) / 8.0
            else:
                visit = w[4] + 1.0
        self.steps[bucket] += 1.0
        self.since_halving += 1
        if self.since_halving >= WINDOW:
            self.since_halving = 0
            self.steps = [s / 2.0 for s in self.steps]
            self.count = [[c / 2.0 for c in row] for row in self.count]
        run = (w[1] + 1.0 if w is not None else 1.0) if gamma == 0 else 0.0
        self.workers[worker] = [float(gamma), run, context, float(bucket), visit]

    def off_tokens(self) -> float:
        """Tokens to catch up if speculation were switched on now (worst worker; 0: it is on)."""
        off = [min(w[1], w[2]) if w[2] > 0 else w[1] for w in self.workers.values() if w[0] == 0]
        return max(off, default=0.0)

    def context(self) -> float:
        return max((w[2] for w in self.workers.values()), default=0.0)

    def visit_tokens(self, bucket: int) -> float:
        """Tokens a drafter skips during one visit to ``bucket`` at γ = 0."""
        ctx = self.context()
        return min(self.dwell[bucket], ctx) if ctx > 0 else self.dwell[bucket]

    def into(self, i: int) -> list[float]:
        """P(the previous step was in bucket j, j ≠ i | a step in bucket i), for every j."""
        s = self.steps[i]
        return [self.count[j][i] / s if s > 0 and j != i else 0.0 for j in range(self.n)]

    def out_of(self, i: int) -> list[float]:
        """P(the next step is in bucket j, j ≠ i | a step in bucket i), for every j."""
        s = self.steps[i]
        return [self.count[i][j] / s if s > 0 and j != i else 0.0 for j in range(self.n)]

    def state_dict(self) -> dict[str, Any]:
        return {
            "count": [list(r) for r in self.count], "steps": list(self.steps), "dwell": list(self.dwell),
            "since_halving": self.since_halving, "workers": {k: list(v) for k, v in self.workers.items()},
        }  # fmt: skip

    def load_state_dict(self, s: dict[str, Any]) -> None:
        if len(s["steps"]) != self.n:
            raise ValueError(f"saved transitions have {len(s['steps'])} buckets, this policy {self.n}")
        self.count = [[float(c) for c in row] for row in s["count"]]
        self.steps = [float(x) for x in s["steps"]]
        self.dwell = [float(x) for x in s["dwell"]]
        self.since_halving = int(s["since_halving"])
        self.workers = {str(k): [float(x) for x in v] for k, v in s["workers"].items()}
