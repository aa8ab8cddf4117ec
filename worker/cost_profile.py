"""The worker's cost profile over its life: measured at start, published, re-measured when
the KV pool changes.

``measure`` runs ``worker.profiling.profile_engine`` in a thread before the worker takes
jobs and logs how long it took; ``publish`` (at start and with every heartbeat) writes a new
profile under the model's key (``keys.cost_profile``), where the planner reads it. ``note``
watches each step's memory events: an offload, reload or resize marks the profile stale,
and ``when_idle`` (called by the engine loop while the engine has nothing to do) measures
it again for the new pool — γ = 0 only while the drafters are offloaded. A job that
arrives during that pass stops it; the step that carried the job is handed back to be
written as usual, and the pass is tried again at the next idle moment.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from functools import partial

import anyio
import redis.asyncio as aioredis

from shared import keys
from shared.control import Decision
from shared.profile import CostProfile
from worker.engine.api import Engine, StepResult, StepStats
from worker.profiling import Interrupted, ProfileSettings, Stopped, profile_engine

log = logging.getLogger(__name__)

POOL_CHANGES = ("offload", "reload", "kv_resize")


class CostProfiler:
    def __init__(
        self,
        r: aioredis.Redis,
        engine: Engine,
        model: str,
        worker_id: str,
        settings: ProfileSettings,
        decision: Callable[[], Decision | None] = lambda: None,
    ) -> None:
        self.r, self.engine, self.model, self.worker_id = r, engine, model, worker_id
        self.settings = settings
        self.decision = decision  # the decision in force, restored after a pass
        self.profile: CostProfile | None = None
        self.stale = False  # the pool changed since the last measurement
        self.resident = True  # the drafters' weights are on the device
        self.published: CostProfile | None = None
        self._stop = threading.Event()  # the worker is stopping: no pass runs or goes on

    def stop(self) -> None:
        """End a pass in progress at its next engine step (any thread), and start none again."""
        self._stop.set()

    async def measure(self, source: str = "startup") -> StepResult | None:
        """One profiling pass in a thread; a step that also ran real requests when the pass
        was interrupted (None otherwise)."""
        if not self.settings.enabled:
            log.info("cost profile of %s skipped (--no-profile)", self.model)
            return None
        if self._stop.is_set():
            return None
        budget = self.settings.budget_s
        log.info("measuring the cost profile of %s (%s; up to %.0f s)", self.model, source, budget)
        run = partial(
            profile_engine, self.engine, self.model, self.settings, worker_id=self.worker_id,
            offloaded=not self.resident, restore=self.decision, source=source, stop=self._stop,
        )  # fmt: skip
        try:
            profile = await anyio.to_thread.run_sync(run)
        except Stopped:
            log.info("cost profile of %s stopped: the worker is stopping", self.model)
            return None
        except Interrupted as exc:
            log.info("cost profile of %s interrupted by a job; measured again when idle", self.model)
            self.stale = True
            return StepResult(exc.outputs, exc.stats)
        self.stale = False
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
        return None

    async def publish(self) -> None:
        """Write the latest profile under the model's key (nothing before one is measured)."""
        if self.profile is not None and self.profile is not self.published:
            await self.r.set(keys.cost_profile(self.model), self.profile.dumps())
            self.published = self.profile

    def note(self, stats: StepStats) -> None:
        """Watch a step for a change of the KV pool."""
        if any(e.kind in POOL_CHANGES for e in stats.memory_events):
            self.stale = True
        self.resident = stats.draft_resident

    async def when_idle(self) -> StepResult | None:
        """Measure again if the pool changed (the engine is idle); see ``measure``."""
        if not (self.stale and self.settings.enabled):
            return None
        return await self.measure("after a pool change")  # published with the next heartbeat
