"""Taking one job-stream entry: skip, dead-letter, end, or make it a run for the engine.

Handlers are idempotent because delivery is at-least-once: a job whose result is already
written is just acknowledged; a cancelled job that never started is ended without running;
a job started more than ``max_deliveries`` times is dead-lettered and its client told. A
start takes the job's lease (worker/leases.py), so a worker that lost the job to another
writes nothing more for it; a re-run continues from the output already sent. Tokenizing runs
in a thread, off the event loop. Admission decides; the service admits the run it returns.
"""

from __future__ import annotations

import logging
from typing import Any

import anyio
import redis.asyncio as aioredis

from shared import codec, jobs, keys
from shared.errors import ErrorCode
from shared.schemas import ErrorEvent, FinishEvent, FinishReason, JobRequest, StartEvent
from shared.streams import Entry
from worker.intake import JobIntake, guess_job_id
from worker.job_run import JobRun, Resume
from worker.leases import JobWrite, Leases, NotStarted
from worker.prompts import PromptEncoder

log = logging.getLogger(__name__)

# Entries of at most this many bytes in all are tokenized on the event loop (well under a
# millisecond); bigger ones in a thread, so that the loop never waits on a huge prompt.
INLINE_ENCODE_BYTES = 16_384


def _size(fields: dict[Any, Any]) -> int:
    return sum(len(v) for v in fields.values() if isinstance(v, bytes | str))


def context_length_message(max_len: int, prompt: int, completion: int) -> str:
    """OpenAI's wording, which clients (LiteLLM, LangChain) recognise."""
    return (
        f"This model's maximum context length is {max_len} tokens. However, you requested "
        f"{prompt + completion} tokens ({prompt} in the messages, {completion} in the completion). "
        "Please reduce the length of the messages or completion."
    )


class Admission:
    def __init__(
        self,
        r: aioredis.Redis,
        intake: JobIntake,
        leases: Leases,
        prompts: PromptEncoder,
        worker_id: str,
        max_deliveries: int,
        max_model_len: int,
        progress_s: float = 0.5,
    ) -> None:
        self.r = r
        self.progress_s = progress_s  # how often a final_only job's tokens are written
        self.intake = intake
        self.leases = leases
        self.prompts = prompts
        self.worker_id = worker_id
        self.max_deliveries = max_deliveries
        self.max_model_len = max_model_len

    async def take(self, entry_id: bytes, fields: dict[Any, Any]) -> JobRun | None:
        """Handle one entry; the JobRun when the job is to go to the engine."""
        runs = await self.take_many([(entry_id, fields)])
        return runs[0] if runs else None

    async def take_many(self, got: list[Entry]) -> list[JobRun]:
        """Handle entries together — one start script and one tokenizing hand-off for all,
        so a burst of jobs joins the engine at once; the JobRuns of the jobs that are to go
        to the engine, in order. One round trip: the start events go out through the
        outbox (``start_write``), and a cancel that races the start is caught by the
        service's cancel follower (worker/running.py ``cancel``), not by asking Redis."""
        decoded: list[tuple[bytes, dict[Any, Any], JobRequest]] = []
        for entry_id, fields in got:
            try:
                job = codec.from_entry_as(fields, JobRequest)
            except codec.CodecError as exc:
                await self._reject(entry_id, fields, f"malformed entry: {exc}", guess_job_id(fields), 0)
                continue
            decoded.append((entry_id, fields, job))
        started: list[tuple[bytes, JobRequest, int, int]] = []
        leases = await self.leases.start_many([job.job_id for _, _, job in decoded])
        for (entry_id, fields, job), (lease, attempt) in zip(decoded, leases, strict=True):
            if lease == NotStarted.ENDED:  # just acknowledge
                await self.intake.ack(entry_id)
            elif lease == NotStarted.CANCELLED:
                await self._end_unstarted(entry_id, _cancelled_before_start(job.job_id, self.worker_id))
            elif attempt > self.max_deliveries:
                reason = f"started {attempt - 1} times without finishing (limit {self.max_deliveries})"
                await self._reject(entry_id, fields, reason, job.job_id, lease)
            else:
                started.append((entry_id, job, lease, attempt))
        jobs = [job for _, job, _, _ in started]
        if sum(_size(fields) for _, fields, _ in decoded) <= INLINE_ENCODE_BYTES:
            encoded = self._encode_all(jobs)  # short prompts: a thread hand-off costs more
        else:  # a long prompt must not stall the event loop (a 10 MB one took 15 s)
            encoded = await anyio.to_thread.run_sync(self._encode_all, jobs)
        runs: list[JobRun] = []
        for (entry_id, job, lease, attempt), prompt_ids in zip(started, encoded, strict=True):
            if isinstance(prompt_ids, Exception):  # a template or tokenizer failure is the request's fault
                await self._fail(job.job_id, lease, entry_id, ErrorCode.BAD_REQUEST, str(prompt_ids))
                continue
            want = len(prompt_ids) + job.params.max_tokens
            if self.max_model_len and want > self.max_model_len:
                msg = context_length_message(self.max_model_len, len(prompt_ids), job.params.max_tokens)
                await self._fail(job.job_id, lease, entry_id, ErrorCode.CONTEXT_LENGTH_EXCEEDED, msg)
                continue
            resume = await self._resume(job.job_id) if lease > 1 else Resume()  # started before
            # A job that was running when workers died max_deliveries - 1 times runs its last
            # delivery alone: if it is what kills workers, it alone is dead-lettered.
            alone = 1 < attempt == self.max_deliveries
            run = JobRun(
                job,
                entry_id,
                prompt_ids,
                self.prompts.tokenizer,
                self.worker_id,
                resume,
                lease,
                alone,
                self.progress_s,
            )
            run.attempt = attempt
            runs.append(run)
        for run in runs:
            log.info(
                "job %s started (attempt %d, %d prompt tokens, %d resumed) request %s",
                run.job_id,
                run.attempt,
                len(run.prompt_ids),
                run.resume.tokens,
                run.job.request_id,
                extra={"job_id": run.job_id, "request_id": run.job.request_id},
            )
        return runs

    def _encode_all(self, batch: list[JobRequest]) -> list[list[int] | Exception]:
        out: list[list[int] | Exception] = []
        for job in batch:
            try:
                out.append(self.prompts.encode(job))
            except Exception as exc:  # the request's fault: reported for it alone
                out.append(exc)
        return out

    def start_write(self, run: JobRun) -> JobWrite:
        """The job's start event, for the outbox: it lands before the job's first tokens
        (one writer, in order), and a job another worker started meanwhile is dropped when
        the write finds the lease gone, as any lost job is."""
        start = StartEvent(
            job_id=run.job_id,
            worker_id=self.worker_id,
            attempt=run.attempt,
            prompt_tokens=len(run.prompt_ids),
        )
        return JobWrite(run.job_id, run.lease, run.entry_id, [start])

    async def _resume(self, job_id: str) -> Resume:
        events = []
        for _, fields in await self.r.xrange(keys.job_events(self.intake.model, job_id)) or []:
            try:
                events.append(codec.from_entry(dict(fields or {})))
            except codec.CodecError:
                continue
        return Resume.from_events(events)

    async def _fail(self, job_id: str, lease: int, entry_id: bytes, code: ErrorCode, message: str) -> None:
        err = ErrorEvent(job_id=job_id, code=code, message=message)
        await self.leases.write([JobWrite(job_id, lease, entry_id, [], err)])

    async def _end_unstarted(self, entry_id: bytes, final: FinishEvent | ErrorEvent) -> None:
        async with self.r.pipeline(transaction=False) as pipe:
            jobs.add_result(pipe, final, self.leases.ttl_s, model=self.intake.model)
            await pipe.execute()
        await self.intake.ack(entry_id)

    async def _reject(
        self, entry_id: bytes, fields: dict[Any, Any], reason: str, job_id: str | None, lease: int
    ) -> None:
        """Dead-letter the entry alone; tell the job's client when the job is known."""
        log.error("dead-lettering entry %s: %s", entry_id.decode(), reason)
        await self.intake.dead_letter(entry_id, fields, reason)
        if job_id is None:
            return
        if lease > 0:
            await self._fail(job_id, lease, entry_id, ErrorCode.DEAD_LETTER, reason)
        else:
            err = ErrorEvent(job_id=job_id, code=ErrorCode.DEAD_LETTER, message=reason)
            await self._end_unstarted(entry_id, err)


def _cancelled_before_start(job_id: str, worker_id: str) -> FinishEvent:
    return FinishEvent(
        job_id=job_id,
        finish_reason=FinishReason.CANCELLED,
        text="",
        token_ids=[],
        prompt_tokens=0,
        completion_tokens=0,
        worker_id=worker_id,
    )
