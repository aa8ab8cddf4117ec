"""The gateway's view of Redis: enqueue jobs, read their state and events, cancel them
(who serves them: ``registry``, gateway/registry.py).

Every job carries its owner (a digest of the API key that made it); a job of another owner
is, to a caller, exactly an unknown job (404 job_not_found). Ids that are not well formed
are unknown jobs too, without a Redis lookup.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from typing import Any

import anyio
import redis.asyncio as aioredis
from redis.exceptions import NoScriptError, RedisError

from gateway.admission import METADATA, MODEL, OWNER, Admission, Admitted, parse
from gateway.admission_list import ListAdmission, Submitted, submit_list
from gateway.errors import APIError
from gateway.hub import EventHub
from gateway.ids import job_not_found, valid_job_id
from gateway.job_events import JobEvents
from gateway.job_events import StoredEvent as StoredEvent  # re-exported: where callers find it
from gateway.job_events import valid_event_id as valid_event_id
from gateway.outage import CancelBacklog, OutageStats
from gateway.registry import WorkerRegistry, raw_bytes
from gateway.settings import GatewaySettings
from shared import codec, jobs, keys
from shared.errors import ErrorCode
from shared.replication import ReplicaWait
from shared.schemas import CancelRequest, ErrorEvent, FinishEvent, JobRequest
from shared.streams import group_load

CANCEL_MAXLEN = 10_000  # cancellations are only read live; a short history suffices
CANCEL_NOW_S = 5.0  # a cancel not written within this is remembered and written later
MODEL_CACHE = 100_000  # job id -> model entries remembered (a job never changes model)




class JobStore(JobEvents):
    def __init__(self, r: aioredis.Redis, settings: GatewaySettings) -> None:
        self.r = r
        self.settings = settings
        self.max_queue = settings.max_queue
        self._admission = Admission(r)
        self.list_admission = ListAdmission(r)  # a list of jobs, all or none (gateway/admission_list.py)
        self.hub = EventHub(r)
        self.registry = WorkerRegistry(r, settings.worker_timeout_s)
        self.cancels = CancelBacklog(self.request_cancel)  # written once Redis is back
        self.outages = OutageStats()  # readers riding out Redis outages (gateway/outage.py)
        self._models: OrderedDict[str, str] = OrderedDict()
        # Admissions and cancellations on a replica before the answer (shared/replication.py).
        self.replicas = ReplicaWait.for_url(r, settings.redis_url)

    async def queue_load(self, model: str | None = None) -> int:
        """Jobs on a model's stream (every live model's when None) not yet acknowledged:
        running plus waiting for a worker."""
        if model is not None:
            models = [model]
        else:
            models = sorted({w.model for w in await self.registry.workers(60.0)})
        total = 0
        for m in models:
            pending, lag = await group_load(self.r, keys.jobs_stream(m), keys.JOBS_GROUP)
            total += pending + lag
        return total

    def remember(self, job_id: str, model: str) -> None:
        self._models[job_id] = model
        self._models.move_to_end(job_id)
        if len(self._models) > MODEL_CACHE:
            self._models.popitem(last=False)

    async def model_of(self, job_id: str) -> str | None:
        """The model whose keys hold the job (None: unknown or expired)."""
        if not valid_job_id(job_id):
            return None
        got = self._models.get(job_id)
        if got is not None:
            return got
        raw = await self.r.get(keys.job_model(job_id))
        if raw is None:
            return None
        model = str(_text(raw))
        self.remember(job_id, model)
        return model

    async def _claim_id(self, job: JobRequest) -> None:
        """Bind the job id to its model (``keys.job_model``) before admission; an id bound
        to another model is a 409. Never undone: a binding whose job was refused points at
        no job (an unknown job) and expires with the record's TTL."""
        ttl = max(1, int(self.settings.result_ttl_s))
        ref = keys.job_model(job.job_id)
        if not await self.r.set(ref, job.model.encode(), nx=True, ex=ttl):
            bound = _text(await self.r.get(ref))
            if bound is not None and bound != job.model:
                raise APIError.of(
                    ErrorCode.CONFLICT,
                    f"job id {job.job_id} (or its Idempotency-Key) is already used for another model",
                    param="id",
                )
        self.remember(job.job_id, job.model)

    async def submit(
        self,
        job: JobRequest,
        *,
        owner: str,
        fingerprint: str,
        max_queue: int | None = None,
        fresh: bool = False,
        batch: bool = False,
    ) -> Submitted:
        """Enqueue ``job`` atomically (429 past the backlog limit). An id already taken by the
        same owner with the same fingerprint is the same job (returned, not enqueued again);
        otherwise 409. An unseeded sampling job stays unseeded: the engine verifies its drafts
        by rejection sampling, which accepts more of them than the keyed draws a seed asks for
        (docs/speculation.md "Seeded sampling"); a re-run after a worker failure continues
        from the tokens already sent either way (worker/job_run.py ``Resume``).

        ``fresh``: the id was just made (``new_job_id``: 122 random bits), so no job, binding
        or retry holds it: the binding, the admission and the owner's index then go in one
        round trip (``_admit_fresh``) instead of three."""
        limit = self.max_queue if max_queue is None else max_queue
        if batch:  # the batch band: its own stream and limit (never live load)
            limit = self.settings.max_batch_queue if max_queue is None else max_queue
            await self._claim_id(job)
            got = await self._admit(job, limit, owner, fingerprint, batch=True)
        elif fresh:
            got = await self._admit_fresh(job, limit, owner, fingerprint)
        else:
            await self._claim_id(job)
            got = await self._admit(job, limit, owner, fingerprint)
        if got.outcome == "full":
            band = "batch jobs" if batch else "jobs"
            raise APIError.of(ErrorCode.QUEUE_FULL, f"server busy: {got.load} {band} queued (limit {limit})")
        if got.outcome == "exists":
            if got.owner != owner or got.fingerprint != fingerprint:
                raise APIError.of(
                    ErrorCode.CONFLICT,
                    f"job id {job.job_id} (or its Idempotency-Key) is already used for another request",
                    param="id",
                )
            return Submitted(job.job_id, created=False, status=got.status)
        if batch or not fresh:
            async with self.r.pipeline(transaction=False) as pipe:
                self.index(pipe, job, owner)
                await pipe.execute()
        ttl = max(1, int(self.settings.result_ttl_s))
        await self.replicas.confirm(
            {
                keys.job_model(job.job_id): ttl,
                keys.job_key(job.model, job.job_id): ttl,
                keys.owner_jobs(owner): ttl,
            }
        )
        return Submitted(job.job_id, created=True, status=jobs.JobStatus.QUEUED.value)

    async def submit_many(self, batch: list[tuple[JobRequest, str]], *, owner: str) -> list[Submitted]:
        """Enqueue every ``(job, fingerprint)`` of a list, or none (gateway/admission_list.py)."""
        return await submit_list(self, batch, owner)

    async def _admit(
        self, job: JobRequest, limit: int, owner: str, fingerprint: str, *, batch: bool = False
    ) -> Admitted:
        """The admission script alone (loaded first if Redis does not have it)."""
        ttl_s = self.settings.result_ttl_s
        return await self._admission.submit(
            job, max_queue=limit, ttl_s=ttl_s, owner=owner, fingerprint=fingerprint, batch=batch
        )

    async def _admit_fresh(self, job: JobRequest, limit: int, owner: str, fingerprint: str) -> Admitted:
        """Bind, admit and index a job of a fresh id in one pipeline (three key slots, so not
        one script). The index entry is written before the script's answer is known: a job
        the queue refused has it removed again (a listing meanwhile skips it, as it skips an
        expired job). The binding's answer is not read: a fresh id is nobody's."""
        ttl_s = self.settings.result_ttl_s
        async with self.r.pipeline(transaction=False) as pipe:
            pipe.set(keys.job_model(job.job_id), job.model.encode(), nx=True, ex=max(1, int(ttl_s)))
            self._admission.queue(
                pipe, job, max_queue=limit, ttl_s=ttl_s, owner=owner, fingerprint=fingerprint
            )
            self.index(pipe, job, owner)
            replies = await pipe.execute(raise_on_error=False)
        self.remember(job.job_id, job.model)
        reply = replies[1]
        if isinstance(reply, NoScriptError):  # Redis restarted, or never ran the script: load it
            got = await self._admit(job, limit, owner, fingerprint)
        else:
            for r in replies:
                if isinstance(r, Exception):
                    raise r
            got = parse(reply)
        if got.outcome == "full":
            await self.r.zrem(keys.owner_jobs(owner), job.job_id)
        return got

    def index(self, pipe: aioredis.client.Pipeline, job: JobRequest, owner: str) -> None:
        """Queue the job in its owner's list (``GET /v1/jobs``) in ``pipe``: a sorted set by
        submit time, trimmed to the record TTL (its own slot: not in the admission script)."""
        ttl = max(1, int(self.settings.result_ttl_s))
        key = keys.owner_jobs(owner)
        pipe.zadd(key, {job.job_id: job.created_at})
        pipe.zremrangebyscore(key, "-inf", f"({time.time() - ttl}")
        pipe.expire(key, ttl)

    async def _fields(self, job_id: str, owner: str) -> dict[str, Any]:
        model = await self.model_of(job_id)
        if model is None:
            raise job_not_found(job_id)
        raw = await self.r.hgetall(keys.job_key(model, job_id))
        fields = {str(_text(k)): v for k, v in raw.items()}
        if not fields or _text(fields.get(OWNER, b"")) != owner:
            raise job_not_found(job_id)
        return fields

    async def info(self, job_id: str, owner: str = "") -> dict[str, Any]:
        """Status and result of a job (404 when unknown, expired or another owner's)."""
        fields = await self._fields(job_id, owner)
        out: dict[str, Any] = {
            "id": job_id,
            "object": "job",
            "model": _text(fields.get(MODEL)),
            "created_at": _float(fields.get(jobs.CREATED_AT)),
            "metadata": _metadata(fields.get(METADATA)),
            "status": _text(fields.get(jobs.STATUS)),
            "attempts": int(fields.get(jobs.ATTEMPTS, 0)),
            "worker": _text(fields.get(jobs.WORKER)),
            "result": None,
            "error": None,
        }
        if jobs.RESULT in fields:
            try:
                final = codec.decode(raw_bytes(fields[jobs.RESULT]))
            except codec.CodecError:
                return out
            out["error" if isinstance(final, ErrorEvent) else "result"] = final.model_dump(mode="json")
        return out

    async def ended(self, job_id: str) -> bool:
        """The job is over (terminal status) or gone (expired): no event will come."""
        model = await self.model_of(job_id)
        if model is None:
            return True
        return jobs.is_over(await self.r.hget(keys.job_key(model, job_id), jobs.STATUS))

    async def cancel(self, job_id: str, owner: str = "") -> str:
        """Ask whichever worker has the job to stop it; returns the status afterwards."""
        fields = await self._fields(job_id, owner)
        try:
            status = jobs.status_of(fields.get(jobs.STATUS))
        except ValueError:
            status = None
        if status is not None and status in jobs.TERMINAL:
            return status.value
        await self.request_cancel(job_id)
        return "cancelling"

    async def cancel_soon(self, job_id: str) -> None:
        """Cancel the job now, or — Redis down — as soon as Redis answers (``cancels``).
        Never raises: the caller is already answering its client."""
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(CANCEL_NOW_S):
                try:
                    await self.request_cancel(job_id)
                    return
                except (RedisError, OSError):
                    pass
            self.cancels.add(job_id)

    async def request_cancel(self, job_id: str) -> None:
        model = await self.model_of(job_id)
        if model is None:
            return
        ttl = max(1, int(self.settings.result_ttl_s))
        async with self.r.pipeline(transaction=True) as pipe:  # one slot: the model's tag
            # The flag covers a job not yet taken; the broadcast reaches one already running.
            pipe.set(keys.job_cancel(model, job_id), b"1", ex=ttl)
            pipe.xadd(
                keys.cancel_stream(model),
                codec.entry(CancelRequest(job_id=job_id)),
                maxlen=CANCEL_MAXLEN,
                approximate=True,
            )
            await pipe.execute()
        await self.replicas.confirm({keys.job_cancel(model, job_id): ttl})

    async def result(self, job_id: str) -> FinishEvent | ErrorEvent | None:
        """The final event stored in the job record, if any."""
        model = await self.model_of(job_id)
        if model is None:
            return None
        raw = await self.r.hget(keys.job_key(model, job_id), jobs.RESULT)
        if raw is None:
            return None
        try:
            msg = codec.decode(raw_bytes(raw))
        except codec.CodecError:
            return None
        return msg if isinstance(msg, FinishEvent | ErrorEvent) else None


def _text(v: Any) -> str | None:
    return v.decode() if isinstance(v, bytes) else v


def _float(v: Any) -> float | None:
    try:
        return float(_text(v) or "")
    except ValueError:
        return None


def _metadata(v: Any) -> dict[str, str]:
    if v is None:
        return {}
    try:
        got = json.loads(_text(v) or "{}")
    except ValueError:
        return {}
    return got if isinstance(got, dict) else {}
