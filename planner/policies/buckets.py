"""Batch-size buckets: the context of the γ bandits and the rows of a published gamma_table.

Two built-in schemes: ``pow2`` (upper bounds 1, 2, 4, …, 256, then everything larger) keeps
the small, memory-bound batches — where the best γ changes fastest — apart, with few
buckets at large batch sizes where step time grows smoothly; ``pairs`` is the authors' fork
(bucket ⌊(B−1)/2⌋ capped at 11, i.e. upper bounds 2, 4, …, 22, then everything larger).
A strictly increasing list of upper bounds is accepted too.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence

from shared.control import ALL_BATCHES


def upper_bounds(spec: str | Sequence[int]) -> list[int]:
    """Ascending upper bounds for a scheme name or an explicit list; the last is ``ALL_BATCHES``."""
    if spec == "pow2":
        bounds = [1 << i for i in range(9)]
    elif spec == "pairs":
        bounds = [2 * (i + 1) for i in range(11)]
    elif isinstance(spec, str):
        raise ValueError(f"unknown bucket scheme {spec!r} (pow2, pairs, or a list of upper bounds)")
    else:
        bounds = [int(b) for b in spec]
        if not bounds or bounds[0] < 1 or any(b <= a for a, b in itertools.pairwise(bounds)):
            raise ValueError(f"bucket upper bounds must be positive and increasing, got {bounds}")
    return [b for b in bounds if b < ALL_BATCHES] + [ALL_BATCHES]


class Buckets:
    """Maps a batch size to its bucket index and turns per-bucket γ into a gamma_table."""

    def __init__(self, spec: str | Sequence[int]) -> None:
        self.uppers = upper_bounds(spec)

    def __len__(self) -> int:
        return len(self.uppers)

    def index(self, batch_size: int) -> int:
        """Bucket of ``batch_size`` (≥ 1); batch sizes past the last bound go to the last bucket."""
        return min(bisect.bisect_left(self.uppers, max(1, batch_size)), len(self.uppers) - 1)

    def representative(self, i: int) -> int:
        """A batch size inside bucket ``i`` (its upper bound; the largest finite one for the last)."""
        if self.uppers[i] == ALL_BATCHES:
            return 2 * self.uppers[i - 1] if i > 0 else 1
        return self.uppers[i]

    def table(self, gammas: Sequence[int]) -> list[tuple[int, int]]:
        """A gamma_table (upper bound, γ), merging neighbouring buckets with the same γ."""
        if len(gammas) != len(self.uppers):
            raise ValueError(f"need {len(self.uppers)} γ values, got {len(gammas)}")
        out: list[tuple[int, int]] = []
        for upper, gamma in zip(self.uppers, gammas, strict=True):
            if out and out[-1][1] == gamma:
                out[-1] = (upper, gamma)
            else:
                out.append((upper, int(gamma)))
        return out
