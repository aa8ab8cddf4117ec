"""The job API: submit, inspect, follow (SSE, resumable), cancel.

A submit may name its job (``id``) or carry an ``Idempotency-Key`` header; either way a
retry of the same request returns the same job (``Idempotent-Replayed: true``), and the
same id or key with a different request is a 409. Jobs are visible to their owner only.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from fastapi import APIRouter, Header, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from redis.exceptions import RedisError

from gateway import sse
from gateway.auth import owner
from gateway.errors import APIError, from_validation, store_down
from gateway.ids import client_job_id, fingerprint, idempotent_job_id, job_not_found, new_job_id, valid_job_id
from gateway.store import JobStore, valid_event_id
from gateway.submission import capacity, fit_max_tokens
from shared.errors import ErrorCode
from shared.schemas import INT32_MAX, ChatMessage, JobRequest, SamplingParams

router = APIRouter()
REPLAYED_HEADER = "Idempotent-Replayed"


class JobSubmission(BaseModel):
    """Exactly one of prompt, prompt_token_ids, messages; ``id`` optionally names the job."""

    model_config = ConfigDict(extra="forbid")
    id: str | None = None
    prompt: str | None = None
    prompt_token_ids: list[int] | None = None
    messages: list[ChatMessage] | None = None
    params: SamplingParams = Field(default_factory=SamplingParams)
    priority: int = Field(default=0, ge=-INT32_MAX, le=INT32_MAX)


def _store(request: Request) -> JobStore:
    store: JobStore = request.app.state.store
    return store


def chosen_job_id(request: Request, given: str | None, idempotency_key: str | None) -> tuple[str, bool]:
    """(the job id, whether a retry reaches the same id): the client's id, else the
    Idempotency-Key's, else a fresh one."""
    if given is not None:
        return client_job_id(given), True
    derived = idempotent_job_id(owner(request), idempotency_key)
    return (derived, True) if derived is not None else (new_job_id(), False)


@router.post("/v1/jobs", status_code=202, response_model=None)
async def submit(
    body: JobSubmission,
    request: Request,
    idempotency_key: str | None = Header(default=None, alias="Idempotency-Key"),
) -> Response:
    store = _store(request)
    job_id, stable = chosen_job_id(request, body.id, idempotency_key)
    cap = await capacity(store, job_id if stable else None)
    prompt_tokens = len(body.prompt_token_ids) if body.prompt_token_ids is not None else None
    explicit = "max_tokens" in body.params.model_fields_set
    max_tokens = fit_max_tokens(cap, body.params.max_tokens, explicit, prompt_tokens)
    fields = body.model_dump(exclude={"id"})
    fields["params"] = body.params.model_copy(update={"max_tokens": max_tokens})
    try:
        job = JobRequest(job_id=job_id, **fields)
    except ValidationError as exc:
        raise from_validation(exc) from None
    except ValueError as exc:
        raise APIError.of(ErrorCode.BAD_REQUEST, str(exc)) from None
    fp = fingerprint("jobs", body.model_dump(mode="json", exclude={"id"}))
    got = await store.submit(job, owner=owner(request), fingerprint=fp)
    headers = {REPLAYED_HEADER: "true"} if not got.created else {}
    return JSONResponse({"id": got.job_id, "status": got.status}, status_code=202, headers=headers)


@router.get("/v1/jobs/{job_id}")
async def get_job(job_id: str, request: Request) -> dict[str, object]:
    return await _store(request).info(job_id, owner(request))


@router.get("/v1/jobs/{job_id}/events", response_model=None)
async def job_events(
    job_id: str, request: Request, last_event_id: str | None = Header(default=None)
) -> Response:
    """The job's events as SSE (id: the event's stream entry id). Reconnect with
    Last-Event-ID to continue after the last event received; the stream ends after the
    finish or error event, or at once when the job is over and nothing follows the id."""
    if not valid_job_id(job_id):
        raise job_not_found(job_id)
    store = _store(request)
    await store.info(job_id, owner(request))  # 404 for an unknown job (or another owner's)
    after = last_event_id or "0-0"
    if not valid_event_id(after):
        raise APIError.of(
            ErrorCode.BAD_REQUEST,
            "Last-Event-ID must be an event id like 1700000000000-0",
            param="Last-Event-ID",
        )
    keepalive_s: float = request.app.state.settings.keepalive_s

    async def body() -> AsyncIterator[str]:
        try:
            async for ev in store.events(job_id, after=after, block_s=keepalive_s):
                if ev is None:
                    yield sse.KEEPALIVE
                else:
                    yield sse.event(ev.id, ev.msg.kind, ev.msg.model_dump(mode="json"))
        except (RedisError, OSError) as exc:  # no id: a reconnect resumes after the last real event
            yield f"event: error\ndata: {json.dumps(store_down(exc).body())}\n\n"

    return sse.response(body())


@router.delete("/v1/jobs/{job_id}", response_model=None)
async def cancel(job_id: str, request: Request) -> Response:
    status = await _store(request).cancel(job_id, owner(request))
    code = 202 if status == "cancelling" else 200
    return JSONResponse({"id": job_id, "status": status}, status_code=code)
