"""Load phases: open-loop Poisson arrivals or closed-loop users, each with its content.

A phase plan such as ``low:0.5:60,high:6:120,low:0.5:60`` (name:rate_req_per_s:duration_s)
gives a piecewise-constant rate (open loop). A rate written ``4u`` means 4 concurrent users
instead (closed loop: each sends its next request when its last one is answered, so tokens/s
measures capacity); a plan is one or the other. A fourth field names the phase's content, a
``+``-separated mix of content sources drawn in equal shares (repeat a name to weigh it):
``chat_low:4u:60:chat,mixed_high:32u:120:chat+code,code_low:4u:60:code``. Without it a phase
replays the run's workload file. Arrivals inside each phase are a Poisson process of that
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
    rate: float  # requests per second (0: no arrivals); 0 for a closed-loop phase
    duration_s: float
    users: int = 0  # closed loop: concurrent users (0: open loop, Poisson at ``rate``)
    content: tuple[str, ...] = ()  # content sources mixed in equal shares (empty: the workload)

    @property
    def closed(self) -> bool:
        return self.users > 0

    @property
    def load(self) -> str:
        return f"{self.users} users" if self.closed else f"{self.rate:g} req/s"


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


def _phase(part: str) -> Phase:
    bits = part.split(":")
    if len(bits) not in (3, 4) or not bits[0]:
        raise ValueError(f"phase {part!r} is not name:rate_req_per_s|Nu:duration_s[:content+content]")
    load = bits[1].strip()
    closed = load.lower().endswith("u")
    try:
        users, rate = (int(load[:-1]), 0.0) if closed else (0, float(load))
        duration = float(bits[2])
    except ValueError:
        raise ValueError(f"phase {part!r}: rate (or Nu users) and duration must be numbers") from None
    if closed and users < 1:
        raise ValueError(f"phase {part!r}: a closed-loop phase needs at least 1 user")
    if rate < 0 or duration <= 0:
        raise ValueError(f"phase {part!r}: rate must be >= 0 and duration > 0")
    content: tuple[str, ...] = ()
    if len(bits) == 4:
        content = tuple(c.strip() for c in bits[3].split("+"))
        if not all(content):
            raise ValueError(f"phase {part!r}: content is name[+name...], got {bits[3]!r}")
    return Phase(bits[0], rate, duration, users, content)


def parse_phases(spec: str) -> list[Phase]:
    """``name:rate:duration[:content][,...]``; raises ValueError naming the bad part."""
    phases = [_phase(part) for part in (p.strip() for p in spec.split(",")) if part]
    if not phases:
        raise ValueError("the phase plan is empty")
    if len({p.closed for p in phases}) > 1:
        raise ValueError("a phase plan is open loop (req/s) or closed loop (Nu users), not both")
    return phases


def is_closed_loop(phases: list[Phase]) -> bool:
    return bool(phases) and phases[0].closed


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
