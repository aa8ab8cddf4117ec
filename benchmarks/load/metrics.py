"""Per-phase numbers of one configuration, from request records and telemetry.

A phase's throughput is that of its arrival cohort: the output tokens of the requests that
arrived in it, divided by the time from the phase's start to the later of its end and the
last of those requests' completion. In a phase the server keeps up with, that is the offered
load; in an overloaded one it is what the configuration can serve, and a backlog is charged to
the phase that made it, never credited to the next one (tokens streamed inside the window,
whoever asked for them, are kept as ``output_tokens``: a backlog drained in a quiet phase
would otherwise count as that phase's speed). The whole run divides every token by the
makespan (from the start of the first phase to the last [DONE]). Latencies of a phase are
those of the requests that arrived in it. Acceptance, γ, drafter, offload and KV usage come
from the telemetry steps inside the window. Goodput counts only the requests that met the
run's SLO (TTFT and TPOT bounds): their output tokens over the same span as throughput.

Closed loop (N users per phase, phases one after another, each starting once the last one's
requests are answered): a phase's throughput is the tokens streamed inside its window over
the window's length — its capacity at N users; the drain between phases belongs to none.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from benchmarks.load.client import RequestRecord
from benchmarks.load.phases import Window
from shared.control import Decision, Telemetry

WHOLE_RUN = "all"


@dataclass
class Dist:
    n: int = 0
    p50: float | None = None
    p99: float | None = None
    mean: float | None = None


def dist(values: list[float]) -> Dist:
    if not values:
        return Dist()
    a = np.asarray(values, dtype=float)
    return Dist(len(values), float(np.percentile(a, 50)), float(np.percentile(a, 99)), float(a.mean()))


@dataclass(frozen=True)
class Slo:
    """A request meets the SLO when its TTFT and its TPOT are both within these bounds."""

    ttft_s: float = 2.0
    tpot_s: float = 0.2

    def met(self, r: RequestRecord) -> bool:
        ttft, tpot = r.ttft, r.tpot
        return r.ok and ttft is not None and ttft <= self.ttft_s and (tpot is None or tpot <= self.tpot_s)

    def describe(self) -> str:
        return f"TTFT ≤ {self.ttft_s:g} s and TPOT ≤ {self.tpot_s * 1e3:g} ms"


def parse_slo(spec: str) -> Slo:
    """``ttft=2,tpot=0.2`` (seconds); raises ValueError naming the bad part."""
    values: dict[str, float] = {}
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        key, eq, value = part.partition("=")
        if not eq or key.strip() not in ("ttft", "tpot"):
            raise ValueError(f"SLO part {part!r} is not ttft=SECONDS or tpot=SECONDS")
        try:
            values[key.strip() + "_s"] = float(value)
        except ValueError:
            raise ValueError(f"SLO part {part!r}: not a number") from None
        if values[key.strip() + "_s"] <= 0:
            raise ValueError(f"SLO part {part!r}: must be > 0")
    return Slo(**values)


@dataclass
class PhaseStats:
    label: str
    start_s: float
    end_s: float
    requests: int = 0
    completed: int = 0
    errors: int = 0
    output_tokens: float = 0.0  # streamed to clients inside the window, by any request
    cohort_tokens: int = 0  # output tokens of the requests that arrived in the window
    tok_s: float = 0.0  # the arrival cohort's output tokens per second (module docstring)
    slo_met: int = 0  # requests of the cohort that met the SLO
    goodput_tok_s: float = 0.0  # their output tokens over the cohort's span
    server_tok_s: float | None = None  # from telemetry num_tokens
    ttft: Dist = field(default_factory=Dist)
    tpot: Dist = field(default_factory=Dist)
    e2e: Dist = field(default_factory=Dist)
    proposed: int = 0
    accepted: int = 0
    acceptance: float | None = None
    mean_gamma: float | None = None  # γ the engine ran (telemetry)
    decided_gamma: float | None = None  # γ the decision in force gave each step's batch size
    gamma_share: dict[int, float] = field(default_factory=dict)  # γ -> share of decode steps
    drafter_share: dict[str, float] = field(default_factory=dict)  # drafter -> share of speculative steps
    offloaded_share: float | None = None  # share of steps with the draft not resident
    kv_mean: float | None = None
    kv_max: float | None = None
    mean_batch: float | None = None


def tokens_in(records: list[RequestRecord], start: float, end: float) -> float:
    """Tokens streamed to clients in [start, end)."""
    total = 0.0
    for r in records:
        if r.ok and r.chunk_s and r.completion_tokens:
            per_chunk = r.completion_tokens / len(r.chunk_s)
            total += per_chunk * sum(start <= t < end for t in r.chunk_s)
    return total


def makespan(records: list[RequestRecord]) -> float:
    ends = [r.end_s for r in records if r.end_s is not None]
    return max(ends) if ends else 0.0


def is_step(t: Telemetry) -> bool:
    return t.batch_size > 0 or t.prefill_tokens > 0 or t.num_tokens > 0


def steps_in(telemetry: list[Telemetry], t0_wall: float, start: float, end: float) -> list[Telemetry]:
    return [t for t in telemetry if is_step(t) and start <= t.ts - t0_wall < end]


def _shares(keys: list[str]) -> dict[str, float]:
    return {k: v / len(keys) for k, v in sorted(Counter(keys).items())} if keys else {}


def decided_gamma(t: Telemetry, decisions: dict[int, Decision]) -> int | None:
    """The γ that the decision the step ran under (by version) gave its batch size."""
    d = decisions.get(t.decision_version)
    return None if d is None or t.fallback else d.gamma_for(t.batch_size)


def add_telemetry(ps: PhaseStats, steps: list[Telemetry], decisions: dict[int, Decision]) -> None:
    """Fill the engine-side fields of ``ps`` from the telemetry steps of its window."""
    span = ps.end_s - ps.start_s
    ps.server_tok_s = sum(t.num_tokens for t in steps) / span if steps and span > 0 else None
    ps.proposed = sum(t.proposed for t in steps)
    ps.accepted = sum(t.accepted for t in steps)
    ps.acceptance = ps.accepted / ps.proposed if ps.proposed else None
    decode = [t for t in steps if t.batch_size > 0]
    if decode:
        ps.mean_gamma = sum(t.gamma for t in decode) / len(decode)
        decided = [g for t in decode if (g := decided_gamma(t, decisions)) is not None]
        ps.decided_gamma = sum(decided) / len(decided) if decided else None
        ps.mean_batch = sum(t.batch_size for t in decode) / len(decode)
        ps.gamma_share = {int(k): v for k, v in _shares([str(t.gamma) for t in decode]).items()}
        ps.drafter_share = _shares([t.drafter or "default" for t in decode if t.gamma > 0])
    if steps:
        ps.offloaded_share = sum(not t.draft_resident for t in steps) / len(steps)
    kv = [1.0 - t.free_blocks / t.total_blocks for t in steps if t.total_blocks > 0]
    if kv:
        ps.kv_mean, ps.kv_max = float(np.mean(kv)), float(max(kv))


def phase_stats(
    label: str,
    start: float,
    end: float,
    arrived: list[RequestRecord],
    all_records: list[RequestRecord],
    telemetry: list[Telemetry],
    t0_wall: float,
    decisions: dict[int, Decision],
    closed: bool = False,
    slo: Slo | None = None,
    capacity: bool = False,
) -> PhaseStats:
    """The window [start, end) ([start, end] when ``closed``): latencies of the requests
    that ``arrived`` in it, tokens streamed inside it by any request, telemetry steps inside it.
    ``capacity`` (closed loop): throughput is the tokens streamed inside the window over its
    length — the phase's users were all active throughout, and no other phase's were."""
    ps = PhaseStats(label, start, end)
    ps.requests = len(arrived)
    ps.completed = sum(r.ok for r in arrived)
    ps.errors = ps.requests - ps.completed
    ok = [r for r in arrived if r.ok]
    ps.ttft = dist([v for r in ok if (v := r.ttft) is not None])
    ps.tpot = dist([v for r in ok if (v := r.tpot) is not None])
    ps.e2e = dist([v for r in ok if (v := r.e2e) is not None])
    ps.output_tokens = tokens_in(all_records, start, math.nextafter(end, math.inf) if closed else end)
    ps.cohort_tokens = sum(r.completion_tokens or 0 for r in ok)
    served_by = max([end, *(r.end_s for r in ok if r.end_s is not None)])
    ps.tok_s = ps.cohort_tokens / (served_by - start) if served_by > start else 0.0
    good = [r for r in ok if (slo or Slo()).met(r)]
    ps.slo_met = len(good)
    good_tokens = sum(r.completion_tokens or 0 for r in good)
    ps.goodput_tok_s = good_tokens / (served_by - start) if served_by > start else 0.0
    if capacity and end > start:
        ps.tok_s = ps.output_tokens / (end - start)
        ps.goodput_tok_s = tokens_in(good, start, end) / (end - start)
    add_telemetry(ps, steps_in(telemetry, t0_wall, start, end), decisions)
    return ps


def config_stats(
    records: list[RequestRecord],
    telemetry: list[Telemetry],
    decisions: list[Decision],
    t0_wall: float,
    ws: list[Window],
    slo: Slo | None = None,
    capacity: bool = False,
) -> list[PhaseStats]:
    """One PhaseStats per window, then the whole run (label ``all``: to the last [DONE]);
    ``capacity`` for closed-loop windows (see ``phase_stats``)."""
    by_version = {d.version: d for d in decisions}
    out = [
        phase_stats(w.label, w.start_s, w.end_s, [r for r in records if r.window == w.index],
                    records, telemetry, t0_wall, by_version, slo=slo, capacity=capacity)
        for w in ws
    ]  # fmt: skip
    end = makespan(records) or (ws[-1].end_s if ws else 0.0)
    out.append(phase_stats(WHOLE_RUN, 0.0, end, records, records, telemetry, t0_wall, by_version, True, slo))
    return out
