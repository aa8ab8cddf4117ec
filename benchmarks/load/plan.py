"""The request plan: which prompt arrives when, with how many output tokens.

Open loop: built once per run and replayed unchanged against every configuration: same
arrival times, same prompts (a seeded shuffle of the workload, cycled when the plan needs
more), same ``max_tokens`` per request, and requests are sent with ``ignore_eos`` so every
configuration generates exactly the same number of tokens.

Closed loop (``Nu`` phases): how many requests a phase sends depends on how fast the
configuration answers, so the plan is a function instead of a list: the k-th request sent in
window w is always the same prompt with the same length (``ClosedLoopPlan.request``).

A phase with content draws its prompts from those sources (``benchmarks.load.contents``) in
turn — ``chat+code`` alternates — each source in its own seeded order per window.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from benchmarks.load.contents import ContentLibrary
from benchmarks.load.phases import Phase, Window, is_closed_loop, poisson_arrivals, windows
from benchmarks.load.workloads import Workload, WorkloadError, WorkloadItem

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


class Prompts:
    """Which prompt the k-th request of a window gets: the workload's seeded shuffle (cycled
    over the whole run, as before content existed) or the window's content mix."""

    def __init__(
        self,
        items: list[WorkloadItem],
        seed: int,
        library: ContentLibrary | None = None,
        count: TokenCounter | None = None,
        max_prompt_tokens: int | None = None,
    ) -> None:
        self.items, self.seed, self.library = items, seed, library
        self.count, self.max_prompt_tokens = count, max_prompt_tokens
        self.order = list(range(len(items)))
        random.Random(seed ^ 0x5EED).shuffle(self.order)
        self._pools: dict[str, list[WorkloadItem]] = {}
        self._orders: dict[tuple[int, str], list[int]] = {}

    def pool(self, name: str) -> list[WorkloadItem]:
        """A content source's prompts that fit ``max_prompt_tokens``."""
        if name not in self._pools:
            if self.library is None:
                raise WorkloadError(f"phase content {name!r} needs a content library (--data-dir)")
            got = self.library.get(name)
            if self.count is not None and self.max_prompt_tokens is not None:
                got = [it for it in got if self.count(it.prompt) <= self.max_prompt_tokens]
            if not got:
                raise WorkloadError(f"content {name!r}: no prompt fits {self.max_prompt_tokens} tokens")
            self._pools[name] = got
        return self._pools[name]

    def default(self, k: int) -> WorkloadItem:
        if not self.items:
            raise WorkloadError("a phase without content needs prompts from the workload file")
        return self.items[self.order[k % len(self.order)]]

    def mixed(self, w: Window, k: int) -> WorkloadItem:
        content = w.phase.content
        name = content[k % len(content)]
        items = self.pool(name)
        key = (w.index, name)
        if key not in self._orders:
            order = list(range(len(items)))
            random.Random(f"{self.seed}/{w.index}/{name}").shuffle(order)
            self._orders[key] = order
        return items[self._orders[key][(k // len(content)) % len(items)]]


@dataclass
class _Lengths:
    rule: LengthRule
    count: TokenCounter | None
    cache: dict[tuple[str, str, str], int] = field(default_factory=dict)

    def of(self, item: WorkloadItem) -> int:
        key = (item.category, item.id, item.prompt[:64])
        if key not in self.cache:
            self.cache[key] = self.rule.tokens_for(item, self.count)
        return self.cache[key]


def build_plan(
    items: list[WorkloadItem],
    phases: list[Phase],
    seed: int,
    lengths: LengthRule,
    count: TokenCounter | None = None,
    library: ContentLibrary | None = None,
    max_prompt_tokens: int | None = None,
) -> list[PlannedRequest]:
    """Open loop: arrivals of the phase plan, each paired with its window's next prompt."""
    if not items and not all(p.content for p in phases):
        raise ValueError("no usable prompts in the workload")
    prompts = Prompts(items, seed, library, count, max_prompt_tokens)
    sizes = _Lengths(lengths, count)
    plan: list[PlannedRequest] = []
    in_window: dict[int, int] = {}
    plain = 0
    for k, (t, w) in enumerate(poisson_arrivals(phases, seed)):
        if w.phase.content:
            j = in_window.get(w.index, 0)
            in_window[w.index] = j + 1
            item = prompts.mixed(w, j)
        else:
            item, plain = prompts.default(plain), plain + 1
        plan.append(PlannedRequest(k, t, w.index, item, sizes.of(item), seed * 1_000_003 + k))
    return plan


class ClosedLoopPlan:
    """Closed loop: ``users`` per window send one request after another; the k-th request of
    window w is the same in every configuration. Iterating gives a preview (the first
    ``preview`` requests of each window: the transformers baseline's prompts)."""

    def __init__(self, phases: list[Phase], prompts: Prompts, lengths: _Lengths, seed: int,
                 preview: int = 8) -> None:  # fmt: skip
        self.phases, self.windows = phases, windows(phases)
        self.prompts, self.lengths, self.seed = prompts, lengths, seed
        self._preview = [self.request(w, k, -1, w.start_s) for w in self.windows for k in range(preview)]

    def item(self, w: Window, k: int) -> WorkloadItem:
        if w.phase.content:
            return self.prompts.mixed(w, k)
        # Without content: the workload's order, each window from its own offset in it.
        return self.prompts.default(w.index * 1009 + k)

    def request(self, w: Window, k: int, index: int, sent_s: float) -> PlannedRequest:
        """The k-th request sent in window ``w`` (``index``: its number in the run)."""
        item = self.item(w, k)
        seed = self.seed * 1_000_003 + w.index * 100_003 + k
        return PlannedRequest(index, sent_s, w.index, item, self.lengths.of(item), seed)

    def __iter__(self) -> Iterator[PlannedRequest]:
        return iter(self._preview)

    def __len__(self) -> int:
        return len(self._preview)


Plan = list[PlannedRequest] | ClosedLoopPlan


def make_plan(
    items: list[WorkloadItem],
    phases: list[Phase],
    seed: int,
    lengths: LengthRule,
    count: TokenCounter | None = None,
    library: ContentLibrary | None = None,
    max_prompt_tokens: int | None = None,
) -> Plan:
    """The open-loop list of arrivals, or the closed-loop plan, as the phases ask."""
    if not is_closed_loop(phases):
        return build_plan(items, phases, seed, lengths, count, library, max_prompt_tokens)
    if not items and not all(p.content for p in phases):
        raise ValueError("no usable prompts in the workload")
    prompts = Prompts(items, seed, library, count, max_prompt_tokens)
    return ClosedLoopPlan(phases, prompts, _Lengths(lengths, count), seed)


def warmup_requests(items: list[WorkloadItem], n: int, max_tokens: int) -> list[PlannedRequest]:
    """A few short requests sent before the clock starts (compile, caches, first decisions)."""
    return [PlannedRequest(-1 - i, 0.0, -1, items[i % len(items)], max_tokens, 7 + i) for i in range(n)]
