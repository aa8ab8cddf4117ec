"""The worker's cost profile over its life: measured (or loaded from the cache) at start,
published, measured again when idle.

``measure`` runs ``worker.profiling.profile_engine`` in a thread before the worker takes
jobs and logs how long it took — unless the cache (``worker/profile_cache.py``) holds the
profile of this model, drafters, machine and code: then that one is used at once, and the
worker is ready in seconds. ``publish`` (at start and with every heartbeat) writes a new
profile under the model's key (``keys.cost_profile``), where the planner reads it. ``note``
watches each step: an offload, reload or resize marks the profile stale, and any step with
work restarts the idle clock. ``when_idle`` (called by the engine loop while the engine has
nothing to do) measures again

- at once for a stale profile (the new pool; γ = 0 only while the drafters are offloaded);
- after ``refresh_idle_s`` without work for a profile that came from the cache (the
  refresh: the machine may be busier or freer than when it was cached), written back to it.

Either pass runs only on an idle engine, in a thread. A job admitted during it (``waiting``)
stops it before its next step: the job waits for the profiling step in flight at most, and
its own steps never run beside synthetic sequences (a step that did carry it — the job came
in between — is handed back to be written as usual). The pass is tried again at the next
idle moment (the refresh after another ``refresh_idle_s``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from functools import partial

import anyio
import redis.asyncio as aioredis

from shared import keys
from shared.control import Decision
from shared.profile import CostProfile
from worker.engine.api import Engine, StepResult, StepStats
from worker.profile_cache import ProfileCache
from worker.profiling import Interrupted, ProfileSettings, Stopped, profile_engine

log = logging.getLogger(__name__)

POOL_CHANGES = ("offload", "reload", "kv_resize")
STARTUP, REFRESH, POOL_CHANGE = "startup", "refresh", "after a pool change"


class CostProfiler:
    def __init__(
        self,
        r: aioredis.Redis,
        engine: Engine,
        model: str,
        worker_id: str,
        settings: ProfileSettings,
        decision: Callable[[], Decision | None] = lambda: None,
        cache: ProfileCache | None = None,
        refresh_idle_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        waiting: Callable[[], bool] = lambda: False,
    ) -> None:
        self.r, self.engine, self.model, self.worker_id = r, engine, model, worker_id
        self.settings = settings
        self.decision = decision  # the decision in force, restored after a pass
        self.cache, self.refresh_idle_s, self.clock = cache, refresh_idle_s, clock
        self.waiting = waiting  # a job was admitted (asked from the profiling thread)
        self.profile: CostProfile | None = None
        self.stale = False  # the pool changed since the last measurement
        self.refresh_due = False  # the profile came from the cache: measure it again when idle
        self.busy_at = clock()  # the last step with work (the idle clock starts here)
        self.resident = True  # the drafters' weights are on the device
        self.published: CostProfile | None = None
        self._stop = threading.Event()  # the worker is stopping: no pass runs or goes on

    def stop(self) -> None:
        """End a pass in progress at its next engine step (any thread), and start none again."""
        self._stop.set()

    def _cached(self) -> bool:
        """Take the cached profile, if there is one for this worker's key."""
        cached = self.cache.load() if self.cache is not None else None
        if cached is None:
            return False
        update = {"model": self.model, "worker_id": self.worker_id, "source": f"cache ({cached.source})"}
        self.profile = cached.model_copy(update=update)
        self.refresh_due = True
        log.info(
            "cost profile of %s from the cache (measured %.0f min ago in %.0f s, %s); measured again "
            "after %.0f s idle",
            self.model, (time.time() - cached.measured_at) / 60, cached.measure_s,
            self.cache.path if self.cache else "", self.refresh_idle_s,
        )  # fmt: skip
        return True

    async def measure(self, source: str = STARTUP) -> StepResult | None:
        """One profiling pass in a thread (at start, the cached profile instead when there is
        one); a step that also ran real requests when the pass was interrupted by one (None
        otherwise)."""
        if not self.settings.enabled:
            log.info("cost profile of %s skipped (--no-profile)", self.model)
            return None
        if self._stop.is_set():
            return None
        if source == STARTUP and self._cached():
            return None
        budget = self.settings.budget_s
        log.info("measuring the cost profile of %s (%s; up to %.0f s)", self.model, source, budget)
        run = partial(
            profile_engine, self.engine, self.model, self.settings, worker_id=self.worker_id,
            offloaded=not self.resident, restore=self.decision, source=source, waiting=self.waiting,
            stop=self._stop,
        )  # fmt: skip
        try:
            profile = await anyio.to_thread.run_sync(run)
        except Stopped:
            log.info("cost profile of %s stopped: the worker is stopping", self.model)
            return None
        except Interrupted as exc:
            what = "cost profile of %s (%s) interrupted by a job; measured again when idle"
            log.info(what, self.model, source)
            if source == REFRESH:
                self.busy_at = self.clock()
            else:
                self.stale = True
            return StepResult(exc.outputs, exc.stats) if exc.outputs else None
        self.stale = False
        if source == REFRESH:
            self.refresh_due = False
        if profile is None:
            log.warning(
                "cost profile of %s: nothing measured within %.0f s", self.model, self.settings.budget_s
            )
            return None
        self.profile = profile
        log.info(
            "cost profile of %s measured in %.1f s (%s): batches %s, rows %s, drafters %s, %s KV blocks",
            self.model, profile.measure_s, source, profile.batches, profile.rows,
            ", ".join(profile.drafter_s) or "none", profile.num_blocks,
        )  # fmt: skip
        if self.cache is not None and source in (STARTUP, REFRESH) and self.resident:
            self.cache.store(profile)
        return None

    async def publish(self) -> None:
        """Write the latest profile under the model's key (nothing before one is measured)."""
        if self.profile is not None and self.profile is not self.published:
            await self.r.set(keys.cost_profile(self.model), self.profile.dumps())
            self.published = self.profile

    def note(self, stats: StepStats) -> None:
        """Watch a step for a change of the KV pool; a step with work restarts the idle clock."""
        if any(e.kind in POOL_CHANGES for e in stats.memory_events):
            self.stale = True
        self.resident = stats.draft_resident
        if stats.batch_size or stats.num_tokens or stats.prefill_tokens:
            self.busy_at = self.clock()

    async def when_idle(self) -> StepResult | None:
        """Measure again (the engine is idle) if the pool changed, or to refresh a cached
        profile after ``refresh_idle_s`` without work; see ``measure``. Published with the
        next heartbeat."""
        if not self.settings.enabled:
            return None
        if self.stale:
            return await self.measure(POOL_CHANGE)
        if self.refresh_due and self.resident and self.clock() - self.busy_at >= self.refresh_idle_s:
            return await self.measure(REFRESH)
        return None
