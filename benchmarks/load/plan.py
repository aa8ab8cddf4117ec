"""The request plan: which prompt arrives when, with how many output tokens.

Built once per run and replayed unchanged against every configuration: same arrival times,
same prompts (a seeded shuffle of the workload, cycled when the plan needs more), same
``max_tokens`` per request, and requests are sent with ``ignore_eos`` so every configuration
generates exactly the same number of tokens.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from benchmarks.load.phases import Phase, poisson_arrivals
from benchmarks.load.workloads import Workload, WorkloadItem

TokenCounter = Callable[[str], int]


@dataclass(frozen=True)
class LengthRule:
    """``fixed``: every request gets ``max_tokens``; ``workload``: the item's own length (its
    ``max_tokens``, else its reference answer's token count), clamped to [min_tokens, max_tokens]."""

    mode: str = "fixed"
    max_tokens: int = 64
    min_tokens: int = 8

    def __post_init__(self) -> None:
        if self.mode not in ("fixed", "workload"):
            raise ValueError(f"output lengths are 'fixed' or 'workload', not {self.mode!r}")
        if not 1 <= self.min_tokens <= self.max_tokens:
            raise ValueError("need 1 <= min_tokens <= max_tokens")

    def tokens_for(self, item: WorkloadItem, count: TokenCounter | None) -> int:
        if self.mode == "fixed":
            return self.max_tokens
        n = item.max_tokens
        if n is None and item.reference is not None:
            n = count(item.reference) if count is not None else max(1, len(item.reference) // 4)
        if n is None:
            n = self.max_tokens
        return max(self.min_tokens, min(self.max_tokens, n))


@dataclass(frozen=True)
class PlannedRequest:
    index: int
    arrival_s: float  # seconds after the run starts
    window: int  # index of the phase window it arrives in
    item: WorkloadItem
    max_tokens: int
    seed: int  # per-request sampling seed (matters only when temperature > 0)


def usable_items(
    workload: Workload, count: TokenCounter | None, max_prompt_tokens: int | None
) -> list[WorkloadItem]:
    """Items whose prompt fits ``max_prompt_tokens`` (all of them when either is None)."""
    if count is None or max_prompt_tokens is None:
        return list(workload.items)
    return [it for it in workload.items if count(it.prompt) <= max_prompt_tokens]


def build_plan(
    items: list[WorkloadItem],
    phases: list[Phase],
    seed: int,
    lengths: LengthRule,
    count: TokenCounter | None = None,
) -> list[PlannedRequest]:
    """Arrivals of the phase plan, each paired with the next prompt of a seeded shuffle."""
    if not items:
        raise ValueError("no usable prompts in the workload")
    order = list(range(len(items)))
    random.Random(seed ^ 0x5EED).shuffle(order)
    plan: list[PlannedRequest] = []
    cache: dict[int, int] = {}
    for k, (t, w) in enumerate(poisson_arrivals(phases, seed)):
        j = order[k % len(order)]
        if j not in cache:
            cache[j] = lengths.tokens_for(items[j], count)
        plan.append(PlannedRequest(k, t, w.index, items[j], cache[j], seed * 1_000_003 + k))
    return plan


def warmup_requests(items: list[WorkloadItem], n: int, max_tokens: int) -> list[PlannedRequest]:
    """A few short requests sent before the clock starts (compile, caches, first decisions)."""
    return [PlannedRequest(-1 - i, 0.0, -1, items[i % len(items)], max_tokens, 7 + i) for i in range(n)]
