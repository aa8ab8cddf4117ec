"""The job API: submit, inspect, follow (SSE, resumable), cancel."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Header, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from gateway import sse
from gateway.errors import APIError
from gateway.store import JobStore, new_job_id, valid_event_id
from shared.schemas import ChatMessage, JobRequest, SamplingParams

router = APIRouter()


class JobSubmission(BaseModel):
    """Exactly one of prompt, prompt_token_ids, messages."""

    model_config = ConfigDict(extra="forbid")
    prompt: str | None = None
    prompt_token_ids: list[int] | None = None
    messages: list[ChatMessage] | None = None
    params: SamplingParams = Field(default_factory=SamplingParams)
    priority: int = 0


def _store(request: Request) -> JobStore:
    store: JobStore = request.app.state.store
    return store


@router.post("/v1/jobs", status_code=202)
async def submit(body: JobSubmission, request: Request) -> dict[str, Any]:
    try:
        job = JobRequest(job_id=new_job_id(), **body.model_dump())
    except ValueError as exc:
        raise APIError(400, str(exc)) from None
    job = await _store(request).submit(job)
    return {"id": job.job_id, "status": "queued"}


@router.get("/v1/jobs/{job_id}")
async def get_job(job_id: str, request: Request) -> dict[str, Any]:
    return await _store(request).info(job_id)


@router.get("/v1/jobs/{job_id}/events", response_model=None)
async def job_events(
    job_id: str, request: Request, last_event_id: str | None = Header(default=None)
) -> Response:
    """The job's events as SSE (id: the event's stream entry id). Reconnect with
    Last-Event-ID to continue after the last event received; the stream ends after the
    finish or error event."""
    store = _store(request)
    await store.info(job_id)  # 404 for an unknown job
    after = last_event_id or "0-0"
    if not valid_event_id(after):
        raise APIError(400, "Last-Event-ID must be an event id like 1700000000000-0", param="Last-Event-ID")
    keepalive_s: float = request.app.state.settings.keepalive_s

    async def body() -> AsyncIterator[str]:
        async for ev in store.events(job_id, after=after, block_s=keepalive_s):
            if ev is None:
                yield sse.KEEPALIVE
            else:
                yield sse.event(ev.id, ev.msg.kind, ev.msg.model_dump(mode="json"))

    return sse.response(body())


@router.delete("/v1/jobs/{job_id}", response_model=None)
async def cancel(job_id: str, request: Request) -> Response:
    status = await _store(request).cancel(job_id)
    code = 202 if status == "cancelling" else 200
    return JSONResponse({"id": job_id, "status": status}, status_code=code)
