"""OpenAI-compatible routes: /v1/completions, /v1/chat/completions, /v1/models."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from gateway import sse
from gateway.errors import APIError, error_body, error_status
from gateway.openai_schema import ChatRequest, CompletionRequest, ResponseBuilder
from gateway.settings import GatewaySettings
from gateway.store import JobStore, new_job_id
from shared.schemas import ErrorEvent, FinishEvent, JobRequest, TokenEvent

router = APIRouter()


def _store(request: Request) -> JobStore:
    store: JobStore = request.app.state.store
    return store


def _settings(request: Request) -> GatewaySettings:
    settings: GatewaySettings = request.app.state.settings
    return settings


@router.post("/v1/completions", response_model=None)
async def completions(body: CompletionRequest, request: Request) -> Response:
    params = body.sampling(body.max_tokens or 16)  # OpenAI's default for completions
    job = _job(body.prompt_input(), params, body.priority)
    return await _serve(
        request, job, body, ResponseBuilder(False, job.job_id, _model(body), body.include_usage)
    )


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(body: ChatRequest, request: Request) -> Response:
    max_tokens = body.max_completion_tokens or body.max_tokens or _settings(request).default_max_tokens
    job = _job({"messages": body.chat_messages()}, body.sampling(max_tokens), body.priority)
    return await _serve(
        request, job, body, ResponseBuilder(True, job.job_id, _model(body), body.include_usage)
    )


@router.get("/v1/models")
async def models(request: Request) -> dict[str, Any]:
    workers = await _store(request).workers(_settings(request).worker_timeout_s)
    served: dict[str, float] = {}
    for w in workers:
        served[w.model] = min(served.get(w.model, w.started_at), w.started_at)
    data = [
        {"id": name, "object": "model", "created": int(ts), "owned_by": "nightjar"}
        for name, ts in sorted(served.items())
    ]
    return {"object": "list", "data": data}


def _model(body: CompletionRequest | ChatRequest) -> str:
    return body.model or "nightjar"


def _job(inputs: dict[str, Any], params: Any, priority: int) -> JobRequest:
    try:
        return JobRequest(job_id=new_job_id(), params=params, priority=priority, **inputs)
    except ValueError as exc:
        raise APIError(400, str(exc)) from None


async def _serve(
    request: Request, job: JobRequest, body: CompletionRequest | ChatRequest, out: ResponseBuilder
) -> Response:
    store = _store(request)
    job = await store.submit(job)
    if body.stream:
        return sse.response(_stream(store, job.job_id, out, _settings(request).keepalive_s))
    final = await store.wait(job.job_id)
    if isinstance(final, ErrorEvent):
        status = error_status(final.code)
        return JSONResponse(error_body(status, final.message, code=final.code), status_code=status)
    return JSONResponse(out.full(final))


async def _stream(
    store: JobStore, job_id: str, out: ResponseBuilder, keepalive_s: float
) -> AsyncIterator[str]:
    """Chunks of a streamed completion; a client that goes away cancels its job."""
    ended = False
    try:
        async for ev in store.events(job_id, block_s=keepalive_s):
            if ev is None:
                yield sse.KEEPALIVE
            elif isinstance(ev.msg, TokenEvent) and ev.msg.text:
                yield sse.data(out.chunk(ev.msg.text))
            elif isinstance(ev.msg, FinishEvent):
                yield sse.data(out.chunk("", ev.msg.finish_reason))
                if out.include_usage:
                    yield sse.data(out.usage_chunk(ev.msg))
                yield sse.DONE
                ended = True
            elif isinstance(ev.msg, ErrorEvent):
                yield sse.data(error_body(error_status(ev.msg.code), ev.msg.message, code=ev.msg.code))
                yield sse.DONE
                ended = True
    finally:
        if not ended:
            with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                await store.cancel(job_id)
