"""Measured step costs per batch-size bucket, for the cost model.

t_v(b, k): EWMA of the non-draft time of steps in bucket b that ran γ = k (the verify pass
over k + 1 tokens per sequence plus the rest of the step; catch-up excluded). t_d(b): EWMA of
one draft step (draft_time / γ). A cost not measured in a bucket is borrowed from the nearest
bucket that has it; t_v for an unmeasured k is interpolated linearly between measured k's, or
extended from the nearest measured one by ``verify_slope`` × the plain step per extra token;
t_d defaults to ``draft_ratio`` × the plain step. With nothing measured anywhere every time is
relative to a plain step of 1, so the choice still follows the priors and α̂. ``stalest``
names the length to probe so that no measurement (nor α̂, which only k > 0 refreshes) goes
stale forever.
"""

from __future__ import annotations

from typing import Any

from planner.policies.signals import switch_seconds
from shared.control import Telemetry

MAX_K = 16


class MeasuredCosts:
    """EWMA step-time tables by (bucket, γ) plus draft-step time by bucket."""

    def __init__(self, n_buckets: int, beta: float, draft_ratio: float, verify_slope: float) -> None:
        self.n = n_buckets
        self.beta = beta
        self.draft_ratio = draft_ratio
        self.slope = verify_slope
        self.tv: list[list[float | None]] = [[None] * (MAX_K + 1) for _ in range(n_buckets)]
        self.td: list[float | None] = [None] * n_buckets
        self.steps = [0] * n_buckets  # steps seen per bucket
        self.seen_at = [[-1] * (MAX_K + 1) for _ in range(n_buckets)]  # step of the last sample of k

    def _ewma(self, old: float | None, x: float) -> float:
        return x if old is None else old + self.beta * (x - old)

    def add(self, bucket: int, t: Telemetry) -> None:
        if t.gamma > MAX_K:
            return
        self.steps[bucket] += 1
        self.seen_at[bucket][t.gamma] = self.steps[bucket]
        rest = max(t.step_time - t.draft_time - switch_seconds(t), 1e-9)
        self.tv[bucket][t.gamma] = self._ewma(self.tv[bucket][t.gamma], rest)
        if t.gamma > 0 and t.draft_time > 0:
            self.td[bucket] = self._ewma(self.td[bucket], t.draft_time / t.gamma)

    def stalest(self, bucket: int, lengths: list[int]) -> int:
        """The length whose time in ``bucket`` was measured longest ago (never: first)."""
        return min(lengths, key=lambda k: (self.seen_at[bucket][k], k))

    def _nearest(self, bucket: int, has: Any) -> int | None:
        order = sorted(range(self.n), key=lambda b: (abs(b - bucket), b))
        return next((b for b in order if has(b)), None)

    def _row(self, bucket: int) -> list[float | None] | None:
        b = self._nearest(bucket, lambda i: any(v is not None for v in self.tv[i]))
        return None if b is None else self.tv[b]

    def plain(self, bucket: int) -> float:
        """t_v(0): measured, or inferred from the nearest measured k through the slope prior."""
        row = self._row(bucket)
        if row is None:
            return 1.0
        if row[0] is not None:
            return row[0]
        k, v = next((k, v) for k, v in enumerate(row) if v is not None)
        return v / (1.0 + self.slope * k)

    def verify(self, bucket: int, k: int) -> float:
        row = self._row(bucket)
        base = self.plain(bucket)
        if row is None:
            return base * (1.0 + self.slope * k)
        measured = row[k]
        if measured is not None:
            return measured
        known = [(j, v) for j, v in enumerate(row) if v is not None]
        lower = [(j, v) for j, v in known if j < k]
        upper = [(j, v) for j, v in known if j > k]
        if lower and upper:
            (j0, v0), (j1, v1) = lower[-1], upper[0]
            return v0 + (v1 - v0) * (k - j0) / (j1 - j0)
        j, v = lower[-1] if lower else upper[0]
        return max(v + self.slope * base * (k - j), 1e-9)

    def draft(self, bucket: int) -> float:
        b = self._nearest(bucket, lambda i: self.td[i] is not None)
        td = self.td[b] if b is not None else None
        return td if td is not None else self.draft_ratio * self.plain(bucket)

    def state_dict(self) -> dict[str, Any]:
        return {
            "tv": [list(r) for r in self.tv], "td": list(self.td),
            "steps": list(self.steps), "seen_at": [list(r) for r in self.seen_at],
        }  # fmt: skip

    def load_state_dict(self, s: dict[str, Any]) -> None:
        if len(s["td"]) != self.n:
            raise ValueError(f"saved costs have {len(s['td'])} buckets, this policy {self.n}")
        self.tv = [[None if v is None else float(v) for v in row] for row in s["tv"]]
        self.td = [None if v is None else float(v) for v in s["td"]]
        self.steps = [int(x) for x in s["steps"]]
        self.seen_at = [[int(x) for x in row] for row in s["seen_at"]]
