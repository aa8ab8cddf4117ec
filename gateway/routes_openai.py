"""OpenAI-compatible routes: /v1/completions, /v1/chat/completions, /v1/models.

An ``Idempotency-Key`` header makes a retried request follow the job the first attempt made
(its result, or its stream from the start) instead of running a second one.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Header, Request
from fastapi.responses import Response
from pydantic import ValidationError

from gateway import follow
from gateway.auth import owner
from gateway.errors import APIError, from_validation
from gateway.ids import fingerprint, idempotent_job_id, new_job_id
from gateway.openai_schema import ChatRequest, CompletionRequest, ResponseBuilder
from gateway.settings import GatewaySettings
from gateway.store import JobStore
from gateway.submission import capacity, fit_max_tokens
from shared.errors import ErrorCode
from shared.schemas import JobRequest

router = APIRouter()
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


def _store(request: Request) -> JobStore:
    store: JobStore = request.app.state.store
    return store


def _settings(request: Request) -> GatewaySettings:
    settings: GatewaySettings = request.app.state.settings
    return settings


@router.post("/v1/completions", response_model=None)
async def completions(
    body: CompletionRequest,
    request: Request,
    idempotency_key: str | None = Header(default=None, alias="Idempotency-Key"),
) -> Response:
    inputs = body.prompt_input()
    ids = inputs.get("prompt_token_ids")
    explicit = body.max_tokens is not None
    return await _serve(
        request,
        "completions",
        body,
        inputs,
        body.max_tokens or COMPLETIONS_DEFAULT_MAX_TOKENS,
        explicit,
        len(ids) if ids is not None else None,
        idempotency_key,
    )


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(
    body: ChatRequest,
    request: Request,
    idempotency_key: str | None = Header(default=None, alias="Idempotency-Key"),
) -> Response:
    given = body.max_completion_tokens or body.max_tokens
    max_tokens = given or _settings(request).default_max_tokens
    inputs = {"messages": body.chat_messages()}
    return await _serve(request, "chat", body, inputs, max_tokens, given is not None, None, idempotency_key)


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


async def _serve(
    request: Request,
    route: str,
    body: CompletionRequest | ChatRequest,
    inputs: dict[str, Any],
    max_tokens: int,
    explicit: bool,
    prompt_tokens: int | None,
    idempotency_key: str | None,
) -> Response:
    store = _store(request)
    who = owner(request)
    stable_id = idempotent_job_id(who, idempotency_key)
    job_id = stable_id or new_job_id()
    cap = await capacity(store, stable_id)
    max_tokens = fit_max_tokens(cap, max_tokens, explicit, prompt_tokens)
    job = _job(job_id, inputs, body.sampling(max_tokens), body.priority)
    # The stream flag is how the answer is delivered, not what is asked: a retry may differ.
    fp = fingerprint(route, body.model_dump(mode="json", exclude={"stream", "stream_options"}))
    await store.submit(job, owner=who, fingerprint=fp)
    out = ResponseBuilder(route == "chat", job.job_id, body.model or "nightjar", body.include_usage)
    if body.stream:
        return await follow.stream(request, store, job.job_id, out)
    return await follow.complete(request, store, job.job_id, out)


def _job(job_id: str, inputs: dict[str, Any], params: Any, priority: int) -> JobRequest:
    try:
        return JobRequest(job_id=job_id, params=params, priority=priority, **inputs)
    except ValidationError as exc:
        err = from_validation(exc)
        if err.param and err.param.startswith("prompt_token_ids"):
            err.param = "prompt"
        raise err from None
    except ValueError as exc:
        raise APIError.of(ErrorCode.BAD_REQUEST, str(exc)) from None
