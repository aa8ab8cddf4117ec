"""Load phases and their Poisson arrivals.

A phase plan such as ``low:0.5:60,high:6:120,low:0.5:60`` (name:rate_req_per_s:duration_s)
gives a piecewise-constant rate. Arrivals inside each phase are a Poisson process of that
rate: exponential gaps drawn from one seeded generator, restarted at each phase boundary
(the process is memoryless, so restarting changes nothing but makes each phase's count
depend on its own rate only). The same seed gives the same arrival times in every
configuration of a run.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Phase:
    name: str
    rate: float  # requests per second (0: no arrivals)
    duration_s: float


@dataclass(frozen=True)
class Window:
    """A phase placed on the run's clock: [start_s, end_s) seconds after the run starts."""

    index: int
    phase: Phase
    start_s: float
    end_s: float

    @property
    def label(self) -> str:
        """Unique across the plan even when names repeat (``low#0``, ``high#1``, ``low#2``)."""
        return f"{self.phase.name}#{self.index}"

    def contains(self, t: float) -> bool:
        return self.start_s <= t < self.end_s


def parse_phases(spec: str) -> list[Phase]:
    """``name:rate:duration[,name:rate:duration...]``; raises ValueError naming the bad part."""
    phases: list[Phase] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        bits = part.split(":")
        if len(bits) != 3 or not bits[0]:
            raise ValueError(f"phase {part!r} is not name:rate_req_per_s:duration_s")
        try:
            rate, duration = float(bits[1]), float(bits[2])
        except ValueError:
            raise ValueError(f"phase {part!r}: rate and duration must be numbers") from None
        if rate < 0 or duration <= 0:
            raise ValueError(f"phase {part!r}: rate must be >= 0 and duration > 0")
        phases.append(Phase(bits[0], rate, duration))
    if not phases:
        raise ValueError("the phase plan is empty")
    return phases


def windows(phases: list[Phase]) -> list[Window]:
    out: list[Window] = []
    t = 0.0
    for i, p in enumerate(phases):
        out.append(Window(i, p, t, t + p.duration_s))
        t += p.duration_s
    return out


def total_duration(phases: list[Phase]) -> float:
    return sum(p.duration_s for p in phases)


def poisson_arrivals(phases: list[Phase], seed: int) -> list[tuple[float, Window]]:
    """Arrival times (seconds from the run's start), each with the window it falls in."""
    rng = random.Random(seed)
    out: list[tuple[float, Window]] = []
    for w in windows(phases):
        if w.phase.rate <= 0:
            continue
        t = w.start_s
        while True:
            t += rng.expovariate(w.phase.rate)
            if t >= w.end_s:
                break
            out.append((t, w))
    return out


def window_at(ws: list[Window], t: float) -> Window | None:
    """The window holding time ``t`` (None before the first or after the last)."""
    for w in ws:
        if w.contains(t):
            return w
    return None
