"""The worker service: job stream in, engine steps in a thread, token events out.

Concurrency (one anyio task group): the engine loop runs ``engine.step()`` in a worker
thread and hands each step's output to the outbox (worker/outbox.py), whose writer lands it
in Redis while the next step already runs; the intake loop takes orphans of dead workers
first, then new jobs, when a slot is free; other loops follow cancellations
(worker/cancels.py) and decisions, renew the leases of running jobs, and heartbeat. A job is
acknowledged only with its result, in one fenced script, so a crash anywhere means
redelivery, never a lost job; a worker that lost a job (paused past ``--claim-idle``) writes
nothing more for it. Every loop outlives a Redis outage; ``request_stop`` ends a start at
once and drains a serving worker: no new jobs, running ones finish within
``drain_timeout_s`` or are handed back to the other workers (worker/lifecycle.py).
"""

from __future__ import annotations

import logging
import time
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from shared.connection import connect
from shared.loops import Signal, every, keep_running, retry_redis, wait_for_redis
from shared.settings import RuntimeSettings
from shared.streams import Entry
from worker.admission import Admission
from worker.cancels import CancelFollower
from worker.cost_profile import CostProfiler
from worker.decisions import DecisionFollower
from worker.engine.api import Engine, RequestOutput, StepResult, StepStats
from worker.engine_factory import create_engine
from worker.health import WorkerHealth
from worker.intake import JobIntake, guess_job_id
from worker.job_run import JobRun
from worker.leases import JobWrite, Leases
from worker.lifecycle import drain, start_up
from worker.metrics import WorkerMetrics, log_finished
from worker.outbox import Outbox, StepOutput, Written
from worker.presence import Presence
from worker.profile_cache import ProfileCache, profile_key
from worker.prompts import PromptEncoder
from worker.running import RunningJobs
from worker.settings import WorkerSettings
from worker.step_writes import step_writes
from worker.telemetry import TelemetryPublisher

log = logging.getLogger(__name__)

INLINE_STEP_S = 0.02  # a step after one shorter than this runs on the event loop (see _step)
INLINE_PREFILL_TOKENS = 256  # ... unless more prompt tokens than this came since
WRITER_TURNS = 8  # ... after at most this many loop turns for the outbox to send (Outbox.let_send)


class WorkerService:
    def __init__(
        self,
        settings: WorkerSettings,
        *,
        engine: Engine | None = None,
        prompts: PromptEncoder | None = None,
        redis: aioredis.Redis | None = None,
    ) -> None:
        s = self.settings = settings
        self.r = redis if redis is not None else connect(s.redis_url)
        # Engine options may name the drafters too (``--engine-opt drafters=[...]``): they win.
        model_dir = s.model_path()
        opts = {"drafters": list(s.drafters or ()), "ngram": s.ngram, **s.engine}
        self.engine = engine if engine is not None else create_engine(model_dir, **opts)
        self.prompts = prompts if prompts is not None else PromptEncoder.from_dir(model_dir)
        self.model_name = s.model_name or Path(model_dir).name
        self.max_model_len = self.engine.max_model_len
        self.running = RunningJobs(s.max_jobs)
        self.intake = JobIntake(
            self.r, s.worker_id, s.claim_idle_s, model=self.model_name, autoclaim_s=s.autoclaim_s
        )
        self.leases = Leases(self.r, s.worker_id, s.result_ttl_s, model=self.model_name)
        self.cancels = CancelFollower(self.r, self.model_name, self.running, self.engine, s.block_ms)
        self.decisions = DecisionFollower(self.r, self.engine, s.worker_id, s.decision_check_s, s.block_ms)
        self.telemetry = TelemetryPublisher(self.r, s.worker_id, s.lag_refresh_s, model=self.model_name)
        self.outbox = Outbox(
            self.leases,
            self.telemetry,
            self._written,
            lambda: (self.decisions.version, self.decisions.fallback),
        )
        drafters = list(getattr(self.engine, "drafter_names", []))
        self.presence = Presence(
            self.r, s.worker_id, self.model_name, s.max_jobs, self.max_model_len, drafters
        )
        self.profiler = CostProfiler(
            self.r, self.engine, self.model_name, s.worker_id, s.profiling(), lambda: self.decisions.current,
            cache=self._profile_cache(model_dir), refresh_idle_s=s.profile_idle_s,
            waiting=lambda: len(self.running) > 0,
        )  # fmt: skip
        self.admission = Admission(
            self.r,
            self.intake,
            self.leases,
            self.prompts,
            s.worker_id,
            s.max_deliveries,
            self.max_model_len,
            s.progress_s,
        )
        self.metrics = WorkerMetrics(self.model_name, s.worker_id, self.max_model_len)
        self.jobs_ended = 0
        self.jobs_lost = 0  # jobs another worker took over while this one held them
        self._work = Signal()  # the engine got something to do
        self._stop = anyio.Event()
        self._draining = False
        self._short = False  # the last step was short enough to run the next one inline
        self._prefill = 0  # prompt tokens added since the last step
        self._ended: float | None = None  # when the last step ended (None: idle since)
        self.health = WorkerHealth(s.worker_id, self.model_name, s.max_jobs, lambda: len(self.running))

    def _profile_cache(self, model_dir: str) -> ProfileCache | None:
        """Where this worker's cost profile is cached (``worker/profile_cache.py``); None when
        the profile or its cache is off."""
        s = self.settings
        if not (s.profile and s.profile_cache):
            return None
        key = profile_key(self.engine, model_dir, list(s.drafters or ()), s.profiling())
        return ProfileCache(RuntimeSettings().cache / "profiles", key)

    @property
    def worker_id(self) -> str:
        return self.settings.worker_id

    def request_stop(self) -> None:
        """Drain and return from ``run``: take no new jobs, let running ones finish within
        ``drain_timeout_s``, hand the rest back."""
        self._stop.set()

    async def run(self, burst: bool = False) -> None:
        """Serve until cancelled or stopped; with ``burst``, drain the job stream and return."""
        # Probes (worker/health.py) answer from the start: not ready while the profile is
        # measured and Redis awaited, so a liveness probe does not restart a starting worker.
        http = self.metrics.serve_http(
            self.settings.metrics_port, self.settings.metrics_host, self.health.probe
        )
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self.health.ticking)
                await self._serve(burst)
                tg.cancel_scope.cancel()
        finally:
            if http is not None:
                http.shutdown()

    async def _serve(self, burst: bool) -> None:
        if not await self._start_up():
            log.info("worker %s stopped before it served", self.worker_id)
            return
        self.health.serving = True
        log.info(
            "worker %s serving %s (drafters: %s)",
            self.worker_id,
            self.model_name,
            ", ".join(getattr(self.engine, "drafter_names", [])) or "none",
        )
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._engine_loop)
                tg.start_soon(self.outbox.run)
                tg.start_soon(keep_running, "cancellations", self.cancels.follow)
                tg.start_soon(self.decisions.run)
                tg.start_soon(every, self.settings.renew_s, self._renew, "lease renewal")
                tg.start_soon(every, self.settings.heartbeat_s, self._heartbeat, "heartbeat")
                if burst:
                    await self._burst()
                else:
                    intake = anyio.CancelScope()
                    tg.start_soon(self._intake_until_stopped, intake)
                    await self._stop.wait()
                    intake.cancel()
                    await self._drain()
                tg.cancel_scope.cancel()
        finally:
            self.health.serving = False
            with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                try:
                    await self.presence.leave()
                except (RedisError, OSError) as exc:
                    log.warning("could not deregister: %s", exc)

    async def _start_up(self) -> bool:
        """Measure the cost profile, wait for Redis, register; False when ``request_stop``
        came first (worker/lifecycle.py)."""
        phases = (
            self.profiler.measure,  # before taking jobs: nothing else steps the engine
            partial(wait_for_redis, self.r, f"worker {self.worker_id}"),
            partial(retry_redis, "worker start", self._start),
        )
        return await start_up(self._stop, self.profiler.stop, phases)

    async def _start(self) -> None:
        await self.intake.setup()
        await self.decisions.start()
        await self.presence.beat(0, self.decisions.version, self.decisions.fallback)
        self.health.beat_ok()
        await self.profiler.publish()

    # -- intake ---------------------------------------------------------------------------
    async def _intake_until_stopped(self, scope: anyio.CancelScope) -> None:
        with scope:
            await keep_running("intake", self._intake_iteration)

    async def _wait_for_slot(self) -> int:
        """A free slot, and no job running alone (no batch mates while one does)."""
        while self.running.free_slots() <= 0 or any(run.alone for run in self.running):
            await self.running.ended.wait()
        return self.running.free_slots()

    async def _intake_iteration(self) -> None:
        free = await self._wait_for_slot()
        # Orphans of dead workers first, then what this worker held before it restarted,
        # then new jobs.
        got = await self.intake.autoclaim(free)
        if not got:
            got = await self.intake.read_own_pending(free)
        if not got:
            got = await self.intake.read_live_then_batch(free, self.intake.block_ms(self.settings.block_ms))
        await self._take_all(got)

    async def _take_all(self, got: list[Entry]) -> None:
        todo = [(e, f) for e, f in got if guess_job_id(f) not in self.running]  # (not our own, claimed back)
        if not todo:
            return
        try:
            # Entries in hand are taken to the end even through a Redis outage; together (one
            # start script, one tokenizing hand-off), so a burst joins the batch at once.
            runs = await retry_redis("admission", partial(self.admission.take_many, todo))
        except Exception:  # a bug: one by one, so that only the entry that fails is dead-lettered
            log.exception("admission of %d entries failed; taking them one at a time", len(todo))
            runs = [run for entry_id, fields in todo if (run := await self._take_one(entry_id, fields))]
        for run in runs:
            await self._begin(run)

    async def _take_one(self, entry_id: bytes, fields: dict[Any, Any]) -> JobRun | None:
        try:
            return await retry_redis("admission", partial(self.admission.take, entry_id, fields))
        except Exception as exc:  # a bug must not take the worker down: dead-letter the entry
            log.exception("admission of entry %s failed", entry_id)
            reason = f"admission failed: {exc!r}"
            await retry_redis("dead letter", partial(self.intake.dead_letter, entry_id, fields, reason))
            return None

    async def _begin(self, run: JobRun) -> None:
        """Hold the job, write its start and hand it to the engine (or, when the output a
        failed attempt sent already ends it, its result)."""
        self.running.admit(run)
        await self.outbox.put(StepOutput([self.admission.start_write(run)]))
        reason = run.resumed_final_reason(self.engine.eos_token_ids)
        if reason is not None:  # the output sent before the failover already ends the job
            tail, final = run.finish(reason)
            write = JobWrite(run.job_id, run.lease, run.entry_id, list(tail), final)
            await self.outbox.put(StepOutput([write]))
            return
        # Held (and renewed) from now on, but stepped only when no batch mate breaks the
        # rule: a job on its last delivery runs alone.
        if run.alone:
            log.warning(
                "job %s is on its last delivery: running it alone (request %s)",
                run.job_id,
                run.job.request_id,
                extra={"job_id": run.job_id, "request_id": run.job.request_id},
            )
        while (run.alone and len(self.running) > 1) or any(o.alone for o in self.running if o is not run):
            await self.running.ended.wait()
        self._prefill += len(run.prompt_ids) + run.resume.tokens  # what the next steps prefill
        self.engine.add_request(run.engine_request())
        if run.cancelled:  # its cancel came while it was being admitted
            self.engine.abort_request(run.job_id)
        self._work.fire()

    async def _burst(self) -> None:
        """Take jobs until the stream has none left and every taken job ended."""
        while True:
            free = await self._wait_for_slot()
            got = await self.intake.read_own_pending(free) or await self.intake.read_live_then_batch(
                free, None
            )
            if got:
                await self._take_all(got)
            elif not len(self.running):
                return
            else:
                await self.running.ended.wait()

    async def _drain(self) -> None:
        self._draining = self.health.draining = True
        s = self.settings
        await drain(self.running, self.engine, self.outbox, self.leases, self._heartbeat,
                    worker_id=s.worker_id, timeout_s=s.drain_timeout_s,
                    claim_idle_s=s.claim_idle_s)  # fmt: skip

    # -- leases and presence --------------------------------------------------------------
    async def _renew(self) -> None:
        for job_id in await self.leases.renew(self.running.held()):
            self._lose(job_id)

    def _lose(self, job_id: str) -> None:
        """Another worker holds the job now: stop it here and write nothing more for it."""
        run = self.running.retire(job_id)
        if run is not None:
            run.let_go()
            self.engine.abort_request(job_id)
            self.jobs_lost += 1
            rid = run.job.request_id
            log.warning(
                "job %s was taken over by another worker; stopped here (request %s)",
                job_id,
                rid,
                extra={"job_id": job_id, "request_id": rid},
            )

    async def _heartbeat(self) -> None:
        await self.presence.beat(
            len(self.running), self.decisions.version, self.decisions.fallback, self._draining
        )
        self.health.beat_ok()
        await self.profiler.publish()  # once per measurement

    # -- the engine -----------------------------------------------------------------------
    async def _engine_loop(self) -> None:
        self._ended = None  # a loop (re)started after no step of its own: no gap to charge
        while True:
            if not self.engine.has_unfinished():
                self._ended = None  # waiting for work is no step's cost
                with anyio.move_on_after(self.settings.heartbeat_s):
                    await self._work.wait()
                if not self.engine.has_unfinished():
                    self.metrics.observe_idle()
                    if (mixed := await self.profiler.when_idle()) is not None:  # a job came
                        await self.outbox.put(StepOutput(self._writes(mixed.outputs), mixed.stats))
                        continue
                    await self.outbox.put(StepOutput([], StepStats()))  # idle heartbeat
                    continue
            result = await self._step()
            self.metrics.observe_step(result.stats, self.decisions.version, self.decisions.fallback)
            self.profiler.note(result.stats)
            await self.outbox.put(StepOutput(self._writes(result.outputs), result.stats))

    async def _step(self) -> StepResult:
        """One engine step. A short one runs right here on the event loop: in a thread it
        would cost more than it blocks the loop (the loop and the engine thread fight for the
        interpreter, on one core, and every step is two thread hand-offs); the outbox sends
        the last step's write just before. The step after a long one, or after jobs with more
        than ``INLINE_PREFILL_TOKENS`` prompt tokens to prefill came, runs in a thread, so the
        other loops (leases, cancels, intake) never wait long. Admission does not send a step
        to a thread: it takes every entry in hand in one round trip (``take_many``), so what
        arrives during a step joins at most one step later than it would beside a threaded
        step, and at 32 users the steps it sent to threads cost 1-4 % more worker CPU a token
        (docs/benchmarks/history, "no threaded steps for admission").

        The step's stats carry ``gap_time``: the service's own time since the last step ended
        (its writes, telemetry, intake), what a step costs as served beyond the engine's step
        time; the planner adds it to every step's predicted cost (0 after waiting for work)."""
        inline = self._short and self._prefill <= INLINE_PREFILL_TOKENS
        self._prefill = 0
        if inline:
            await self.outbox.let_send(WRITER_TURNS)  # the last steps' writes go first
        t0 = time.perf_counter()
        result = self.engine.step() if inline else await anyio.to_thread.run_sync(self.engine.step)
        ended, self._ended = self._ended, time.perf_counter()
        self._short = self._ended - t0 < INLINE_STEP_S
        result.stats.gap_time = t0 - ended if ended is not None else 0.0
        return result

    def _writes(self, outputs: list[RequestOutput]) -> list[JobWrite]:
        """The step's new tokens as each job's events, and the final event of jobs that ended
        (worker/step_writes.py)."""
        return step_writes(self.running, self.engine, outputs)

    def _written(self, done: list[Written]) -> None:
        """The outbox landed these writes: retire ended jobs, drop lost ones."""
        for w in done:
            if not w.held:
                self._lose(w.write.job_id)
            elif w.write.final is not None and (run := self.running.retire(w.write.job_id)) is not None:
                self.jobs_ended += 1
                self.metrics.observe_final(w.write.final, run.attempt, run)
                log_finished(run.job, w.write.final, self.worker_id, run.attempt)
