"""A step's outputs made each job's writes: its new tokens as events, and the final event of
a job that ended. A job whose output cannot be turned into events (a bug) fails alone: it
gets an error event and leaves the engine; the others' writes go on."""

from __future__ import annotations

import logging

from shared.errors import ErrorCode
from shared.schemas import ErrorEvent, FinishEvent, FinishReason
from worker.engine.api import Engine, RequestOutput
from worker.job_run import JobRun
from worker.leases import JobWrite
from worker.running import RunningJobs

log = logging.getLogger(__name__)


def step_writes(running: RunningJobs, engine: Engine, outputs: list[RequestOutput]) -> list[JobWrite]:
    """The writes of the jobs running here among ``outputs`` (jobs ended already or lost are
    skipped)."""
    writes = []
    for out in outputs:
        run = running.get(out.request_id)
        if run is None or run.done:  # ended here already (a stop string), or lost
            continue
        try:
            write = job_write(run, engine, out)
        except Exception as exc:
            log.exception("job %s: its output could not be written; the job fails", run.job_id)
            if not out.finished:
                engine.abort_request(run.job_id)
            msg = f"the worker failed on this job's output: {type(exc).__name__}: {exc}"[:2000]
            err = run.fail(ErrorCode.ENGINE_ERROR, msg)
            write = JobWrite(run.job_id, run.lease, run.entry_id, [], err)
        if write is not None:
            writes.append(write)
    return writes


def job_write(run: JobRun, engine: Engine, out: RequestOutput) -> JobWrite | None:
    """One job's events (and final event) from its output of a step."""
    run.cached_prompt_tokens = max(run.cached_prompt_tokens, out.cached_prompt_tokens)
    events = run.feed(out.new_token_ids, out.logprobs, out.prompt_logprobs, out.outcomes)
    if run.stopped and not out.finished:
        engine.abort_request(run.job_id)
    final: FinishEvent | ErrorEvent | None = None
    if out.finished and out.finish_reason == FinishReason.ERROR and not run.stopped:
        code = out.error_code or ErrorCode.ENGINE_ERROR
        final = run.fail(code, out.error or "")
    elif run.stopped or out.finished:
        reason = FinishReason.STOP if run.stopped else out.finish_reason or FinishReason.STOP
        tail, final = run.finish(reason)
        events += tail
    if events or final is not None:
        return JobWrite(run.job_id, run.lease, run.entry_id, list(events), final)
    return None
