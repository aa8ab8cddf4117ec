"""Step-time curves of a target/draft pair, interpolated over batch size and q = γ + 1.

Built in: the two tables measured on this project's 2-core CPU (shared/NOTES.md), fp32,
256-token context, in-place KV cache. ``RANDOM_INIT`` is the 8-layer/512-wide target with a
2-layer/256-wide draft (draft column measured). ``SMOLLM2`` is SmolLM2-135M; it has no draft
partner, so its draft column is an assumption: 0.2 × the target's q = 1 step (NOTES: a
2-layer full-width draft costs 0.16–0.28 of a target step). The engine's own measurements
can replace either: build a CostCurves from them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

FLOOR_S = 1e-5


def _interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear through (xs, ys), extended linearly past both ends."""
    if len(xs) == 1:
        return ys[0]
    i = 1
    while i < len(xs) - 1 and x > xs[i]:
        i += 1
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


@dataclass(frozen=True)
class CostCurves:
    """Target step time T(B, q) and draft step time D(B) in milliseconds, as measured."""

    name: str
    batches: tuple[int, ...]
    qs: tuple[int, ...]
    target_ms: tuple[tuple[float, ...], ...]  # target_ms[i][k]: batch batches[i], q = qs[k]
    draft_ms: tuple[float, ...]  # one draft step (q = 1) at each batch size

    def __post_init__(self) -> None:
        if len(self.target_ms) != len(self.batches) or len(self.draft_ms) != len(self.batches):
            raise ValueError("one target row and one draft value per batch size")
        if any(len(row) != len(self.qs) for row in self.target_ms):
            raise ValueError("one target value per q in every row")

    def target(self, batch: float, q: float) -> float:
        """Seconds for one target pass over q tokens for each of ``batch`` sequences."""
        rows = [_interp(self.qs, row, q) for row in self.target_ms]
        return max(_interp(self.batches, rows, batch), FLOOR_S * 1000) / 1000.0

    def draft(self, batch: float) -> float:
        """Seconds for one draft step over ``batch`` sequences."""
        return max(_interp(self.batches, self.draft_ms, batch), FLOOR_S * 1000) / 1000.0

    def step(self, batch: float, gamma: int) -> float:
        """Seconds for one decoding step at γ: γ draft steps, then one verify pass over γ + 1."""
        return gamma * self.draft(batch) + self.target(batch, gamma + 1)


RANDOM_INIT = CostCurves(
    name="random-init-34M/5.7M",
    batches=(1, 4, 16, 64),
    qs=(1, 2, 3, 5, 9),
    target_ms=(
        (10.4, 13.4, 15.2, 12.2, 14.6),
        (15.7, 15.1, 17.3, 19.5, 24.9),
        (21.9, 29.7, 35.9, 45.5, 66.9),
        (58.0, 84.3, 109.8, 149.8, 237.5),
    ),
    draft_ms=(0.89, 1.94, 2.98, 8.16),
)

_SMOL = (
    (41.7, 64.8, 82.0, 63.1, 76.1),
    (64.9, 71.9, 83.5, 97.3, 127.8),
    (83.2, 152.3, 177.9, 234.5, 323.9),
    (154.8, 295.0, 351.4, 452.7, 667.3),
)
SMOLLM2 = CostCurves(
    name="smollm2-135M",
    batches=(1, 4, 16, 32),
    qs=(1, 2, 3, 5, 9),
    target_ms=_SMOL,
    draft_ms=tuple(0.2 * row[0] for row in _SMOL),
)

CURVES = {"random-init": RANDOM_INIT, "smollm2": SMOLLM2}
