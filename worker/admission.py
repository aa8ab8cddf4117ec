"""Taking one job-stream entry: skip, dead-letter, or start it in the engine.

Handlers are idempotent because delivery is at-least-once: a job whose result is already
written is just acknowledged; a cancelled job that never started is ended without running;
a job started more than ``max_deliveries`` times is dead-lettered and its client told; a
re-run resumes its event stream past what a client has already seen.
"""

from __future__ import annotations

import logging
from typing import Any

import redis.asyncio as aioredis

from shared import codec, jobs, keys
from shared.schemas import ErrorEvent, FinishEvent, JobRequest, StartEvent
from worker.engine.api import Engine, EngineRequest
from worker.intake import JobIntake, guess_job_id
from worker.job_run import JobRun, Resume
from worker.prompts import PromptEncoder

log = logging.getLogger(__name__)


class Admission:
    def __init__(
        self,
        r: aioredis.Redis,
        intake: JobIntake,
        engine: Engine,
        prompts: PromptEncoder,
        active: dict[str, JobRun],
        worker_id: str,
        max_deliveries: int,
    ) -> None:
        self.r = r
        self.intake = intake
        self.engine = engine
        self.prompts = prompts
        self.active = active
        self.worker_id = worker_id
        self.max_deliveries = max_deliveries

    async def take(self, entry_id: bytes, fields: dict[Any, Any]) -> JobRun | None:
        """Handle one entry; the JobRun when the job went to the engine."""
        try:
            job = codec.from_entry(fields)
            if not isinstance(job, JobRequest):
                raise codec.CodecError(f"a {job.kind!r} message is not a job")
        except codec.CodecError as exc:
            await self._reject(entry_id, fields, f"malformed entry: {exc}", guess_job_id(fields))
            return None
        if job.job_id in self.active:  # our own running job, claimed back: nothing to do
            return None
        key, cancel_key = keys.job_key(job.job_id), keys.job_cancel(job.job_id)
        async with self.r.pipeline(transaction=False) as pipe:
            pipe.hget(key, jobs.STATUS)
            pipe.exists(cancel_key)
            raw_status, cancelled = await pipe.execute()
        if jobs.status_of(raw_status) in jobs.TERMINAL:
            await self.intake.ack(entry_id)
            return None
        if cancelled:
            await self._end(entry_id, _cancelled_before_start(job.job_id, self.worker_id))
            return None
        attempt = int(await self.r.hincrby(key, jobs.ATTEMPTS, 1))
        if attempt > self.max_deliveries:
            reason = f"started {attempt - 1} times without finishing (limit {self.max_deliveries})"
            await self._reject(entry_id, fields, reason, job.job_id)
            return None
        try:
            prompt_ids = self.prompts.encode(job)
        except Exception as exc:  # a template or tokenizer failure is the request's fault
            err = ErrorEvent(job_id=job.job_id, code="bad_request", message=str(exc))
            await self._end(entry_id, err)
            return None
        resume = await self._resume(job.job_id) if attempt > 1 else Resume()
        run = JobRun(job, entry_id, prompt_ids, self.prompts.tokenizer, self.worker_id, resume)
        self.active[job.job_id] = run
        start = StartEvent(
            job_id=job.job_id, worker_id=self.worker_id, attempt=attempt, prompt_tokens=len(prompt_ids)
        )
        async with self.r.pipeline(transaction=False) as pipe:
            pipe.hset(key, mapping={jobs.STATUS: jobs.JobStatus.RUNNING.value, jobs.WORKER: self.worker_id})
            pipe.expire(key, keys.JOB_TTL_S)
            jobs.add_events(pipe, job.job_id, [start])
            await pipe.execute()
        self.engine.add_request(EngineRequest(job.job_id, prompt_ids, job.params, job.priority))
        # A cancel that raced the start (its broadcast came before the job was active here).
        if await self.r.exists(cancel_key):
            self.engine.abort_request(job.job_id)
        log.info("job %s started (attempt %d, %d prompt tokens)", job.job_id, attempt, len(prompt_ids))
        return run

    async def _resume(self, job_id: str) -> Resume:
        events = []
        for _, fields in await self.r.xrange(keys.job_events(job_id)) or []:
            try:
                events.append(codec.from_entry(dict(fields or {})))
            except codec.CodecError:
                continue
        return Resume.from_events(events)

    async def _end(self, entry_id: bytes, final: FinishEvent | ErrorEvent) -> None:
        async with self.r.pipeline(transaction=False) as pipe:
            jobs.add_result(pipe, final)
            await pipe.execute()
        await self.intake.ack(entry_id)

    async def _reject(self, entry_id: bytes, fields: dict[Any, Any], reason: str, job_id: str | None) -> None:
        """Dead-letter the entry; tell the job's client when the job is known."""
        log.error("dead-lettering entry %s: %s", entry_id.decode(), reason)
        if job_id is not None:
            async with self.r.pipeline(transaction=False) as pipe:
                jobs.add_result(pipe, ErrorEvent(job_id=job_id, code="dead_letter", message=reason))
                await pipe.execute()
        await self.intake.dead_letter(entry_id, fields, reason)


def _cancelled_before_start(job_id: str, worker_id: str) -> FinishEvent:
    return FinishEvent(
        job_id=job_id,
        finish_reason="cancelled",
        text="",
        token_ids=[],
        prompt_tokens=0,
        completion_tokens=0,
        worker_id=worker_id,
    )
