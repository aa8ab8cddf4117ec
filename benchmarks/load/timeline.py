"""Time series of one configuration for the plots and the JSON: fixed-width bins of
client throughput, engine throughput, γ, batch size, acceptance and KV usage, plus the
planner's decisions and the offload switches as events."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from benchmarks.load.client import RequestRecord
from benchmarks.load.metrics import decided_gamma, is_step
from shared.control import Decision, Telemetry


@dataclass
class Timeline:
    bin_s: float
    t: list[float] = field(default_factory=list)  # bin centres, seconds after the run's start
    tok_s: list[float] = field(default_factory=list)  # streamed to clients
    server_tok_s: list[float] = field(default_factory=list)  # emitted by the engine
    gamma: list[float | None] = field(default_factory=list)  # mean γ of the decode steps
    decided_gamma: list[float | None] = field(default_factory=list)  # what their decisions asked
    batch: list[float | None] = field(default_factory=list)
    acceptance: list[float | None] = field(default_factory=list)
    kv: list[float | None] = field(default_factory=list)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    offload_events: list[dict[str, Any]] = field(default_factory=list)


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def build_timeline(
    records: list[RequestRecord],
    telemetry: list[Telemetry],
    decisions: list[Decision],
    t0_wall: float,
    end_s: float,
    bin_s: float,
) -> Timeline:
    n = max(1, math.ceil(end_s / bin_s))
    tok = [0.0] * n
    for r in records:
        if r.ok and r.chunk_s and r.completion_tokens:
            per = r.completion_tokens / len(r.chunk_s)
            for c in r.chunk_s:
                if 0 <= c < n * bin_s:
                    tok[int(c // bin_s)] += per
    steps: list[list[Telemetry]] = [[] for _ in range(n)]
    for tm in telemetry:
        rel = tm.ts - t0_wall
        if is_step(tm) and 0 <= rel < n * bin_s:
            steps[int(rel // bin_s)].append(tm)
    by_version = {d.version: d for d in decisions}
    tl = Timeline(bin_s)
    for i in range(n):
        s = steps[i]
        decode = [x for x in s if x.batch_size > 0]
        proposed = sum(x.proposed for x in s)
        tl.t.append((i + 0.5) * bin_s)
        tl.tok_s.append(tok[i] / bin_s)
        tl.server_tok_s.append(sum(x.num_tokens for x in s) / bin_s)
        tl.gamma.append(_mean([float(x.gamma) for x in decode]))
        tl.decided_gamma.append(
            _mean([float(g) for x in decode if (g := decided_gamma(x, by_version)) is not None])
        )
        tl.batch.append(_mean([float(x.batch_size) for x in decode]))
        tl.acceptance.append(sum(x.accepted for x in s) / proposed if proposed else None)
        tl.kv.append(_mean([1.0 - x.free_blocks / x.total_blocks for x in s if x.total_blocks > 0]))
    tl.decisions = [
        {"t": d.created_at - t0_wall, "version": d.version, "policy": d.policy,
         "gamma_table": [list(x) for x in d.gamma_table], "drafter": d.drafter, "offload": d.offload,
         "note": d.note}
        for d in decisions
    ]  # fmt: skip
    tl.offload_events = offload_events(telemetry, decisions, t0_wall)
    return tl


def offload_events(
    telemetry: list[Telemetry], decisions: list[Decision], t0_wall: float
) -> list[dict[str, Any]]:
    """Every change of the decided offload flag, and of the draft's residency as reported."""
    events: list[dict[str, Any]] = []
    last: bool | None = None
    for d in decisions:
        if last is not None and d.offload != last:
            events.append({"t": d.created_at - t0_wall, "source": "decision", "offload": d.offload})
        last = d.offload
    resident: bool | None = None
    for tm in telemetry:
        if resident is not None and tm.draft_resident != resident:
            events.append({"t": tm.ts - t0_wall, "source": "worker", "offload": not tm.draft_resident})
        resident = tm.draft_resident
    return sorted(events, key=lambda e: e["t"])
