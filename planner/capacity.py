"""How many workers each model needs, from its workers' cost profile, its queue and an SLO.

Per model the planner measures, every ``capacity_s``:

- the arrival rate λ (jobs/s): the growth of the job stream's ``entries-added`` (XINFO STREAM);
- the output per job L (tokens): tokens the model's workers emitted (their telemetry) over
  jobs that ended (the growth of its finished stream's ``entries-added``);
- the load now: jobs running (the group's pending) and waiting (its lag).

Both rates are exponentially weighted over ``rate_window_s``. From the model's startup cost
profile (``shared.profile.CostProfile``) and the SLO (``SLO``: TTFT and TPOT targets):

- b*: the largest batch whose decoding step stays within the TPOT target (a token per
  sequence per step; speculation only makes steps yield more), capped by the workers'
  ``max_jobs``; a worker then emits b*/step(b*) tokens/s and holds a job S = L·step(b*) s;
- steady need: by Little's law λ·S jobs are in service, b* per worker, at a utilization of at
  most ρ: λ·S / (b*·ρ) workers;
- backlog: the waiting jobs must start within the TTFT target; a worker frees b*/S slots a
  second, so starting ``lag`` jobs in time takes lag·S / (b*·TTFT) more;
- and never fewer than the running jobs fill (running / b*), nor than ``min_workers``.

``Hysteresis`` keeps the published count from flapping, as Kubernetes' HPA does: up at once,
down only to the highest count recommended over the last ``scale_down_window_s``, and a
change of less than ``tolerance`` (relative) is no change.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field

from shared.control import Telemetry, WorkerInfo
from shared.profile import CostProfile


@dataclass(frozen=True)
class SLO:
    ttft_s: float = 2.0  # a waiting job starts within this
    tpot_s: float = 0.1  # seconds per output token of one stream, at most
    utilization: float = 0.8  # ρ: the busiest a worker is planned to be (headroom for prefill, bursts)

    def __post_init__(self) -> None:
        if not (self.ttft_s > 0 and self.tpot_s > 0 and 0 < self.utilization <= 1):
            raise ValueError("ttft_s and tpot_s must be positive, utilization in (0, 1]")


@dataclass(frozen=True)
class Load:
    """What one model's queue and workers show at one moment."""

    arrival_per_s: float  # λ, jobs/s
    tokens_per_job: float  # L
    running: int  # jobs delivered and not yet acknowledged
    waiting: int  # jobs not yet delivered (the group's lag)
    max_jobs: int = 0  # the workers' --max-jobs (0: not known)


@dataclass(frozen=True)
class Need:
    """The planner's estimate for one model (also its metrics and decision note)."""

    workers: float  # before rounding and hysteresis
    batch: int  # b*
    step_s: float  # step(b*)
    worker_tokens_per_s: float  # b* / step(b*)
    job_s: float  # S: one job's time in service at b*


def best_batch(profile: CostProfile, slo: SLO, max_jobs: int = 0) -> int:
    """The largest batch whose plain decoding step stays within the TPOT target (≥ 1)."""
    top = max_jobs if max_jobs > 0 else profile.batches[-1]
    best = 1
    for b in range(1, top + 1):
        if profile.step(b, 0) <= slo.tpot_s * (1 + 1e-9):  # (interpolation rounds)
            best = b
        else:
            break
    return best


def required(profile: CostProfile, load: Load, slo: SLO) -> Need:
    """Workers the load needs under the SLO (a real number: rounded by ``Hysteresis``)."""
    b = best_batch(profile, slo, load.max_jobs)
    step = profile.step(b, 0)
    job_s = max(load.tokens_per_job, 1.0) * step
    steady = load.arrival_per_s * job_s / (b * slo.utilization)
    drain = load.waiting * job_s / (b * slo.ttft_s)
    occupied = load.running / b
    return Need(max(steady + drain, occupied), b, step, b / step, job_s)


@dataclass
class Hysteresis:
    """Up at once; down to the highest recommendation of the last ``scale_down_window_s``;
    changes within ``tolerance`` of the current count ignored."""

    scale_down_window_s: float = 60.0
    tolerance: float = 0.1
    min_workers: int = 1
    max_workers: int = 0  # 0: no cap
    current: int | None = None
    _recent: deque[tuple[float, int]] = field(default_factory=deque)

    def update(self, need: float, now: float) -> int:
        want = max(self.min_workers, math.ceil(need - 1e-9))
        if self.max_workers:
            want = min(want, self.max_workers)
        self._recent.append((now, want))
        while self._recent and self._recent[0][0] < now - self.scale_down_window_s:
            self._recent.popleft()
        if self.current is None:
            self.current = want
        elif want > self.current:
            if need > self.current * (1 + self.tolerance):
                self.current = want
        elif want < self.current:
            self.current = min(self.current, max(w for _, w in self._recent))
        return self.current


class _Rate:
    """An exponentially weighted rate of a counter (per second)."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.value: float | None = None
        self._last: tuple[float, float] | None = None

    def update(self, count: float, now: float) -> float | None:
        if self._last is not None and now > self._last[0] and count >= self._last[1]:
            dt = now - self._last[0]
            rate = (count - self._last[1]) / dt
            w = 1 - math.exp(-dt / self.window_s)
            self.value = rate if self.value is None else self.value + w * (rate - self.value)
        self._last = (now, count)
        return self.value


@dataclass(frozen=True)
class QueueSample:
    """One look at a model's queue (read by ``planner.capacity_io``)."""

    added: int  # entries-added of its job stream
    finished: int  # entries-added of its finished stream
    running: int
    waiting: int


class ModelCapacity:
    """The estimate for one model, fed queue samples and its workers' telemetry."""

    def __init__(
        self, model: str, slo: SLO, hysteresis: Hysteresis, window_s: float, default_tokens: float
    ) -> None:
        self.model = model
        self.slo = slo
        self.hysteresis = hysteresis
        self.default_tokens = default_tokens
        self.arrivals = _Rate(window_s)
        self.finishes = _Rate(window_s)
        self.tokens = _Rate(window_s)
        self.emitted = 0  # tokens its workers reported, all time
        self.tokens_per_job = default_tokens
        self.load: Load | None = None
        self.need: Need | None = None
        self.desired: int | None = None

    def sample(
        self, q: QueueSample, workers: list[WorkerInfo], profile: CostProfile | None, now: float | None = None
    ) -> int | None:
        """Update the rates; the desired worker count (None: no profile to plan with yet)."""
        now = time.time() if now is None else now
        arrival = self.arrivals.update(q.added, now) or 0.0
        finishing = self.finishes.update(q.finished, now)
        tokens = self.tokens.update(self.emitted, now)
        if finishing and tokens is not None and finishing > 1e-6:
            self.tokens_per_job = max(1.0, tokens / finishing)
        max_jobs = min((w.max_jobs for w in workers if w.max_jobs > 0), default=0)
        self.load = Load(arrival, self.tokens_per_job, q.running, q.waiting, max_jobs)
        if profile is None:
            return self.desired
        self.need = required(profile, self.load, self.slo)
        self.desired = self.hysteresis.update(self.need.workers, now)
        return self.desired


class CapacityPlanner:
    """Every model's estimate; telemetry is attributed to models through the registry."""

    def __init__(
        self,
        slo: SLO,
        *,
        window_s: float = 30.0,
        scale_down_window_s: float = 60.0,
        min_workers: int = 1,
        max_workers: int = 0,
        default_tokens: float = 256.0,
    ) -> None:
        self.slo = slo
        self.window_s = window_s
        self.scale_down_window_s = scale_down_window_s
        self.min_workers = min_workers
        self.max_workers = max_workers
        self.default_tokens = default_tokens
        self.models: dict[str, ModelCapacity] = {}
        self.model_of: dict[str, str] = {}  # worker id -> model
        self._unattributed: dict[str, int] = {}  # tokens of workers not yet in the registry

    def model(self, name: str) -> ModelCapacity:
        got = self.models.get(name)
        if got is None:
            hyst = Hysteresis(
                self.scale_down_window_s, min_workers=self.min_workers, max_workers=self.max_workers
            )
            got = self.models[name] = ModelCapacity(name, self.slo, hyst, self.window_s, self.default_tokens)
        return got

    def observe(self, t: Telemetry) -> None:
        model = self.model_of.get(t.worker_id)
        if model is None:
            self._unattributed[t.worker_id] = self._unattributed.get(t.worker_id, 0) + t.num_tokens
        else:
            self.model(model).emitted += t.num_tokens

    def know_workers(self, workers: list[WorkerInfo]) -> None:
        for w in workers:
            self.model_of[w.worker_id] = w.model
            if (late := self._unattributed.pop(w.worker_id, 0)) > 0:
                self.model(w.model).emitted += late

    def desired(self) -> dict[str, int]:
        """model -> desired workers, for the models with an estimate."""
        return {m: c.desired for m, c in sorted(self.models.items()) if c.desired is not None}
