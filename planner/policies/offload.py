"""Squeeze / expand: when to offload the draft model so the KV cache can grow, and when not.

Squeeze (offload) when speculation has been off (γ = 0) on a worker for ``zero_steps`` steps
and its KV cache has been under pressure for ``persist`` consecutive messages: the free
fraction free_blocks/total_blocks below ``low_free``, or requests waiting while the free
fraction is below ``high_free`` (waiting with plenty of free blocks is a batch-size cap, not
memory pressure, and offloading would not help). Expand (reload) when every live worker has
had no waiting requests and a free fraction of at least ``high_free`` for ``expand_persist``
messages, counted *after* giving the draft's blocks back (the pool shrinks by what the
squeeze added, learned from total_blocks with and without the draft resident), so the expand
cannot itself create the pressure that would squeeze again. Hysteresis comes from the gap
between the thresholds, the persistence counters and ``min_hold`` messages between toggles.
While offloaded the policies publish γ = 0 everywhere (the worker enforces it as well).
"""

from __future__ import annotations

from typing import Any

from planner.policies.signals import is_step
from shared.control import Telemetry
from shared.policy_params import Param, float_param, int_param

STALE_S = 30.0  # a worker silent this long is left out of the "every worker relaxed" test

OFFLOAD_PARAMS: dict[str, Param] = {
    "offload_low_free": float_param(0.10, "free KV fraction below which the cache is pressed", 0.0, 1.0),
    "offload_high_free": float_param(0.30, "free KV fraction (after reload) needed to expand back", 0.0, 1.0),
    "offload_persist": int_param(3, "messages the pressure must persist before a squeeze (T)", 1),
    "offload_expand_persist": int_param(20, "messages low load must persist before an expand (T')", 1),
    "offload_zero_steps": int_param(16, "steps γ = 0 must have held on the worker before a squeeze", 0),
    "offload_min_hold": int_param(64, "messages between two toggles, at least", 0),
}


class OffloadRule:
    """Decides Choice.offload from telemetry with hysteresis."""

    def __init__(
        self,
        offload_low_free: float = 0.10,
        offload_high_free: float = 0.30,
        offload_persist: int = 3,
        offload_expand_persist: int = 20,
        offload_zero_steps: int = 16,
        offload_min_hold: int = 64,
    ) -> None:
        if offload_high_free <= offload_low_free:
            raise ValueError("offload_high_free must be above offload_low_free (hysteresis)")
        self.low, self.high = offload_low_free, offload_high_free
        self.persist, self.expand_persist = offload_persist, offload_expand_persist
        self.zero_steps, self.min_hold = offload_zero_steps, offload_min_hold
        self.offloaded = False
        self.since_toggle = offload_min_hold
        self.toggles = 0
        self.resident_total = 0  # pool size seen with the draft resident / offloaded
        self.offloaded_total = 0
        # worker -> [last ts, γ=0 run, pressure run, relaxed run]
        self.workers: dict[str, list[float]] = {}

    def _draft_blocks(self) -> int:
        if self.resident_total and self.offloaded_total:
            return max(0, self.offloaded_total - self.resident_total)
        return 0

    def observe(self, t: Telemetry) -> None:
        if t.total_blocks <= 0:
            return  # no memory information in this message
        self.since_toggle += 1
        if t.draft_resident:
            self.resident_total = t.total_blocks
        else:
            self.offloaded_total = t.total_blocks
        w = self.workers.setdefault(t.worker_id, [t.ts, 0, 0, 0])
        w[0] = t.ts
        if is_step(t):
            w[1] = w[1] + 1 if t.gamma == 0 else 0
        free = t.free_blocks / t.total_blocks
        pressed = free < self.low or (t.waiting > 0 and free < self.high)
        w[2] = w[2] + 1 if pressed else 0
        extra = 0 if t.draft_resident else self._draft_blocks()
        free_after = (t.free_blocks - extra) / max(t.total_blocks - extra, 1)
        w[3] = w[3] + 1 if t.waiting == 0 and free_after >= self.high else 0

    def decide(self) -> bool:
        """Whether the draft should be offloaded now."""
        if self.since_toggle < self.min_hold or not self.workers:
            return self.offloaded
        newest = max(w[0] for w in self.workers.values())
        live = [w for w in self.workers.values() if w[0] >= newest - STALE_S]
        if not self.offloaded:
            flip = any(w[2] >= self.persist and w[1] >= self.zero_steps for w in live)
        else:
            flip = all(w[3] >= self.expand_persist for w in live)
        if flip:
            self.offloaded = not self.offloaded
            self.since_toggle = 0
            self.toggles += 1
        return self.offloaded

    def state_dict(self) -> dict[str, Any]:
        return {
            "offloaded": self.offloaded, "since_toggle": self.since_toggle, "toggles": self.toggles,
            "resident_total": self.resident_total, "offloaded_total": self.offloaded_total,
            "workers": {k: list(v) for k, v in self.workers.items()},
        }  # fmt: skip

    def load_state_dict(self, s: dict[str, Any]) -> None:
        self.offloaded = bool(s["offloaded"])
        self.since_toggle, self.toggles = int(s["since_toggle"]), int(s["toggles"])
        self.resident_total, self.offloaded_total = int(s["resident_total"]), int(s["offloaded_total"])
        self.workers = {str(k): [float(x) for x in v] for k, v in s["workers"].items()}
