"""The worker service: job stream in, engine steps in a thread, token events out.

Concurrency (one anyio task group): the engine loop runs ``engine.step()`` in a worker
thread and turns outputs into events; the intake loop reads the job stream when a slot is
free; other loops follow cancellations and decisions, renew claims on running jobs, take
over jobs of dead workers, and heartbeat. A job is acknowledged only after its result is
written, so a crash anywhere means redelivery, never a lost job.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import cast

import anyio
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from shared import codec, jobs, keys
from shared.connection import connect
from shared.loops import Signal, every, keep_running
from shared.schemas import CancelRequest, ErrorEvent, FinishEvent, FinishReason
from shared.streams import entries, last_id
from worker.admission import Admission
from worker.decisions import DecisionFollower
from worker.engine.api import Engine, RequestOutput, StepStats
from worker.engine_factory import create_engine
from worker.intake import JobIntake
from worker.job_run import JobRun
from worker.presence import Presence
from worker.prompts import PromptEncoder
from worker.settings import WorkerSettings
from worker.telemetry import TelemetryPublisher

log = logging.getLogger(__name__)


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
        opts = {"drafters": s.drafters, "ngram": s.ngram, **s.engine}
        self.engine = engine if engine is not None else create_engine(s.model_dir, **opts)
        self.prompts = prompts if prompts is not None else PromptEncoder.from_dir(s.model_dir)
        self.model_name = s.model_name or Path(s.model_dir).name
        self.intake = JobIntake(self.r, s.worker_id, s.claim_idle_s)
        self.decisions = DecisionFollower(self.r, self.engine, s.worker_id, s.decision_check_s, s.block_ms)
        self.telemetry = TelemetryPublisher(self.r, s.worker_id, s.lag_refresh_s)
        self.presence = Presence(self.r, s.worker_id, self.model_name, s.max_jobs)
        self.active: dict[str, JobRun] = {}
        self.admission = Admission(
            self.r, self.intake, self.engine, self.prompts, self.active, s.worker_id, s.max_deliveries
        )
        self.jobs_ended = 0
        self._cancel_cursor: str | None = None

    @property
    def worker_id(self) -> str:
        return self.settings.worker_id

    async def run(self, burst: bool = False) -> None:
        """Serve until cancelled; with ``burst``, drain the job stream and return."""
        self._work = Signal()  # the engine got something to do
        self._job_ended = Signal()
        await self.intake.setup()
        await self.decisions.start()
        await self.presence.beat(0, self.decisions.version, self.decisions.fallback)
        log.info("worker %s serving %s", self.worker_id, self.model_name)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._engine_loop)
                tg.start_soon(keep_running, "cancellations", self._follow_cancels)
                tg.start_soon(self.decisions.run)
                if burst:
                    tg.start_soon(self._drain, tg.cancel_scope)
                    return
                tg.start_soon(keep_running, "intake", self._intake_iteration)
                tg.start_soon(every, self.settings.renew_s, self._renew, "claim renewal")
                tg.start_soon(every, self.settings.autoclaim_s, self._autoclaim, "autoclaim")
                tg.start_soon(every, self.settings.heartbeat_s, self._heartbeat, "heartbeat")
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                await self.presence.leave()

    # -- admission ------------------------------------------------------------------------
    def free_slots(self) -> int:
        return self.settings.max_jobs - len(self.active)

    async def _wait_for_slot(self) -> int:
        while self.free_slots() <= 0:
            await self._job_ended.wait()
        return self.free_slots()

    async def _take_all(self, got: list[tuple[bytes, dict[bytes, bytes]]]) -> None:
        for entry_id, fields in got:
            run = await self.admission.take(entry_id, fields)
            if run is not None:
                self._work.fire()

    async def _intake_iteration(self) -> None:
        free = await self._wait_for_slot()
        # A restarted worker first finishes what it had taken before (its own pending list).
        got = await self.intake.read_own_pending(free)
        if not got:
            got = await self.intake.read_new(free, self.settings.block_ms)
        await self._take_all(got)

    async def _drain(self, scope: anyio.CancelScope) -> None:
        """Burst mode: take jobs until the stream has none left and every taken job ended."""
        while True:
            free = await self._wait_for_slot()
            got = await self.intake.read_own_pending(free) or await self.intake.read_new(free, None)
            if got:
                await self._take_all(got)
            elif not self.active:
                scope.cancel()
                return
            else:
                await self._job_ended.wait()

    async def _autoclaim(self) -> None:
        if self.free_slots() > 0:
            await self._take_all(await self.intake.autoclaim(self.free_slots()))

    async def _renew(self) -> None:
        await self.intake.renew([run.entry_id for run in self.active.values()])

    async def _heartbeat(self) -> None:
        await self.presence.beat(len(self.active), self.decisions.version, self.decisions.fallback)

    async def _follow_cancels(self) -> None:
        if self._cancel_cursor is None:
            self._cancel_cursor = await last_id(self.r, keys.CANCEL_STREAM)
        resp = await self.r.xread(
            {keys.CANCEL_STREAM: self._cancel_cursor}, count=100, block=self.settings.block_ms
        )
        for entry_id, fields in entries(resp):
            self._cancel_cursor = entry_id.decode()
            try:
                msg = codec.from_entry(fields)
            except codec.CodecError as exc:
                log.error("skipping a malformed cancel entry: %s", exc)
                continue
            if isinstance(msg, CancelRequest) and msg.job_id in self.active:
                log.info("cancelling job %s", msg.job_id)
                self.engine.abort_request(msg.job_id)

    # -- the engine -----------------------------------------------------------------------
    async def _engine_loop(self) -> None:
        while True:
            if not self.engine.has_unfinished():
                with anyio.move_on_after(self.settings.heartbeat_s):
                    await self._work.wait()
                if not self.engine.has_unfinished():
                    await self._publish(StepStats())  # idle heartbeat
                    continue
            result = await anyio.to_thread.run_sync(self.engine.step)
            await self._handle(result.outputs)
            await self._publish(result.stats)

    async def _publish(self, stats: StepStats) -> None:
        try:
            await self.telemetry.publish(stats, self.decisions.version, self.decisions.fallback)
        except RedisError as exc:  # telemetry is best effort
            log.warning("telemetry not published: %s", exc)

    async def _handle(self, outputs: list[RequestOutput]) -> None:
        """Write the step's events and the results of ended jobs and acknowledge those, in one
        transaction: a reader never sees a result whose entry is still pending, and an entry
        is never acknowledged without its result."""
        pipe = self.r.pipeline(transaction=True)
        ended: list[JobRun] = []
        for out in outputs:
            run = self.active.get(out.request_id)
            if run is None:  # ended here already (a stop string), the engine caught up
                continue
            events = run.feed(out.new_token_ids)
            if run.stopped and not out.finished:
                self.engine.abort_request(run.job_id)
            if not (run.stopped or out.finished):
                if events:
                    jobs.add_events(pipe, run.job_id, list(events))
                continue
            final: FinishEvent | ErrorEvent
            if out.finish_reason == "error" and not run.stopped:
                final = ErrorEvent(job_id=run.job_id, code="engine_error", message=out.error or "")
            else:
                reason = "stop" if run.stopped else out.finish_reason or "stop"
                tail, final = run.finish(cast(FinishReason, reason))
                events += tail
            if events:
                jobs.add_events(pipe, run.job_id, list(events))
            jobs.add_result(pipe, final)
            ended.append(run)
        if ended:
            pipe.xack(keys.JOBS_STREAM, keys.JOBS_GROUP, *(run.entry_id for run in ended))
        if len(pipe):
            await pipe.execute()
        if ended:
            for run in ended:
                del self.active[run.job_id]
            self.jobs_ended += len(ended)
            self._job_ended.fire()
