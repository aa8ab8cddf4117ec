"""The startup cost profile's measurements made a table (worker/profiling.py measures them):
per batch size the fastest of the rounds (``BatchCosts``), and the ``CostProfile`` the
planner reads (``assemble``), its times made monotone (``envelope``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shared.profile import CostProfile


@dataclass
class BatchCosts:
    """Medians measured at one batch size."""

    target: dict[int, float] = field(default_factory=dict)  # rows -> seconds
    drafter: dict[str, float] = field(default_factory=dict)  # name -> seconds per draft step
    catch_up: dict[str, float] = field(default_factory=dict)  # name -> seconds per token per sequence
    context: float = 0.0  # mean tokens per sequence over the target steps measured

    def fastest(self, other: BatchCosts | None) -> BatchCosts:
        """Each value the lower of this round's and ``other``'s (every round's context alike)."""
        if other is None:
            return self

        def low(a: dict[Any, float], b: dict[Any, float]) -> dict[Any, float]:
            return {k: min(v for v in (a.get(k), b.get(k)) if v is not None) for k in a.keys() | b.keys()}

        return BatchCosts(low(self.target, other.target), low(self.drafter, other.drafter),
                          low(self.catch_up, other.catch_up), (self.context + other.context) / 2)  # fmt: skip


def assemble(
    done: dict[int, BatchCosts],
    model: str,
    drafters: list[str],
    seconds: float,
    num_blocks: int,
    worker_id: str | None,
    source: str,
    long: dict[int, BatchCosts] | None = None,
) -> CostProfile | None:
    """The profile of the batch sizes measured: rows and drafters measured at all of them;
    the ``long`` context's table where it covers the same batches and rows at a longer
    context (else none)."""
    if not done:
        return None
    batches = sorted(done)
    rows = sorted(set.intersection(*(set(done[b].target) for b in batches)))
    rows = [q for i, q in enumerate(rows) if q == i + 1]  # 1, 2, …: a gap ends the table
    named = [d for d in drafters if all(d in done[b].drafter for b in batches)]
    context = mean([done[b].context for b in batches])
    long = long or {}
    wide = all(b in long and all(q in long[b].target for q in rows) for b in batches)
    long_context = mean([long[b].context for b in batches]) if wide else 0.0
    if not long_context > context > 0:
        long_context, wide = 0.0, False
    return CostProfile(
        context=context,
        long_context=long_context,
        long_target_s=envelope([[long[b].target[q] for q in rows] for b in batches]) if wide else [],
        model=model,
        batches=batches,
        rows=rows,
        target_s=envelope([[done[b].target[q] for q in rows] for b in batches]),
        drafter_s={d: [x[0] for x in envelope([[done[b].drafter[d]] for b in batches])] for d in named},
        catch_up_s={d: [done[b].catch_up[d] for b in batches] for d in named if all(d in done[b].catch_up for b in batches)},  # noqa: E501
        num_blocks=num_blocks or None,
        worker_id=worker_id,
        source=source,
        measure_s=seconds,
    )  # fmt: skip


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def envelope(table: list[list[float]]) -> list[list[float]]:
    """Each time the least measured at that point or any point with more rows or a larger
    batch: a forward over more tokens does not take less time, so a point measured above one
    of those was slowed by noise (which only adds time; the fastest of the reps is already
    kept). On this CPU a single step's time wanders by ±20 %: nj-target at batch 4 measured
    8.6 ms for 5 rows and 7.9 ms for 4 in one pass, 6.6 and 7.7 ms for 4 and 3 in another."""
    out = [list(row) for row in table]
    for i in reversed(range(len(out))):
        for k in reversed(range(len(out[i]))):
            if k + 1 < len(out[i]):
                out[i][k] = min(out[i][k], out[i][k + 1])
            if i + 1 < len(out) and k < len(out[i + 1]):
                out[i][k] = min(out[i][k], out[i + 1][k])
    return out
