"""The job API: submit, inspect, follow (SSE, resumable), cancel.

A submit may name its job (``id``) or carry an ``Idempotency-Key`` header; either way a
retry of the same request returns the same job (``Idempotent-Replayed: true``), and the
same id or key with a different request is a 409. Jobs are visible to their owner only.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Body, Header, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from redis.exceptions import RedisError

from gateway import constraints, listing, sse, webhooks
from gateway.auth import owner
from gateway.errors import APIError, from_validation, store_down
from gateway.ids import client_job_id, fingerprint, idempotent_job_id, job_not_found, new_job_id, valid_job_id
from gateway.openai_schema import check_processors
from gateway.store import JobStore, Submitted, valid_event_id
from gateway.submission import capacity, fit_max_tokens
from shared.errors import ErrorCode
from shared.jobs import JobStatus
from shared.schemas import INT32_MAX, ChatMessage, JobRequest, Message, SamplingParams, TokenEvent

router = APIRouter()
REPLAYED_HEADER = "Idempotent-Replayed"


# OpenAI's sampling names, accepted at the top level as well as in ``params`` (which wins).
TOP_LEVEL_PARAMS = (
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "ignore_eos",
    "min_tokens",
    "stop_token_ids",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
)
MAX_JOBS_PER_SUBMIT = 256


class JobSubmission(BaseModel):
    """Exactly one of prompt, prompt_token_ids, messages; ``id`` optionally names the job.
    Unknown fields are a 400 here (this API is Nightjar's own: a typo should not pass)."""

    model_config = ConfigDict(extra="forbid")
    id: str | None = None
    model: str | None = Field(default=None, max_length=256)
    prompt: str | None = None
    prompt_token_ids: list[int] | None = None
    messages: list[ChatMessage] | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    priority: int = Field(default=0, ge=-INT32_MAX, le=INT32_MAX)
    metadata: dict[str, str] = Field(default_factory=dict)
    webhook_url: str | None = None  # POSTed the job's final state, signed (gateway/webhooks.py)
    include_spec: bool = False  # token events carry ``spec``: which tokens were accepted drafts
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool | None = None
    min_tokens: int | None = None
    stop_token_ids: list[int] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None

    def sampling(self) -> SamplingParams:
        """``params`` over the top-level OpenAI names; the job API's defaults otherwise."""
        top: dict[str, Any] = {k: getattr(self, k) for k in TOP_LEVEL_PARAMS if getattr(self, k) is not None}
        if self.max_completion_tokens is not None:
            top.setdefault("max_tokens", self.max_completion_tokens)
        if isinstance(top.get("stop"), str):
            top["stop"] = [top["stop"]]
        try:
            return SamplingParams.model_validate({**top, **self.params})
        except ValidationError as exc:
            err = from_validation(exc)
            if err.param and not any(err.param.startswith(k) for k in top if k not in self.params):
                err.param = f"params.{err.param}"
                err.message = f"params.{err.message}"
            raise err from None


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
    raw: Annotated[Any, Body()],
    request: Request,
    idempotency_key: str | None = Header(default=None, alias="Idempotency-Key"),
) -> Response:
    """One job (202 ``{"id", "status"}``) or a list (202 ``{"object": "list", "data"}``, in
    order; with an Idempotency-Key, job i's id derives from the key and i)."""
    try:
        body = (
            [JobSubmission.model_validate(x) for x in raw]
            if isinstance(raw, list)
            else JobSubmission.model_validate(raw)
        )
    except ValidationError as exc:
        raise from_validation(exc) from None
    if isinstance(body, JobSubmission):
        got = await _submit_one(request, body, idempotency_key)
        headers = {REPLAYED_HEADER: "true"} if not got.created else {}
        return JSONResponse({"id": got.job_id, "status": got.status}, status_code=202, headers=headers)
    if not 1 <= len(body) <= MAX_JOBS_PER_SUBMIT:
        raise APIError.of(
            ErrorCode.BAD_REQUEST, f"submit 1 to {MAX_JOBS_PER_SUBMIT} jobs at a time", param="body"
        )
    # All or nothing: every job is checked first (any 4xx refuses the list), then one
    # script admits them all or none (gateway/admission_list.py).
    prepared = []
    for i, one in enumerate(body):
        # Job i of a keyed list is the key's job "<key>#<i>": a retry of the list finds them all.
        key = None if idempotency_key is None else f"{idempotency_key}#{i}"
        prepared.append(await _prepare(request, one, key))
    ids = [p.job.job_id for p in prepared]
    if len(set(ids)) != len(ids):
        raise APIError.of(ErrorCode.BAD_REQUEST, "the jobs of a list need distinct ids", param="id")
    store = _store(request)
    admitted = await store.submit_many([(p.job, p.fingerprint) for p in prepared], owner=owner(request))
    for p, done in zip(prepared, admitted, strict=True):
        if p.webhook_url is not None and done.created:
            await webhooks.register(store, "job", done.job_id, p.webhook_url, owner(request))
    data = [{"id": done.job_id, "status": done.status} for done in admitted]
    return JSONResponse({"object": "list", "data": data}, status_code=202)


@dataclass(frozen=True)
class Prepared:
    """A job checked and ready for admission."""

    job: JobRequest
    fingerprint: str
    fresh: bool  # a new random id (no retry can hold it)
    webhook_url: str | None


async def _submit_one(request: Request, body: JobSubmission, idempotency_key: str | None) -> Submitted:
    p = await _prepare(request, body, idempotency_key)
    store = _store(request)
    got = await store.submit(p.job, owner=owner(request), fingerprint=p.fingerprint, fresh=p.fresh)
    if p.webhook_url is not None and got.created:
        await webhooks.register(store, "job", got.job_id, p.webhook_url, owner(request))
    return got


async def _prepare(request: Request, body: JobSubmission, idempotency_key: str | None) -> Prepared:
    """The job of ``body``, checked (APIError otherwise); nothing written yet."""
    store = _store(request)
    job_id, stable = chosen_job_id(request, body.id, idempotency_key)
    cap = await capacity(store, job_id if stable else None, body.model)
    params = body.sampling()
    prompt_tokens = len(body.prompt_token_ids) if body.prompt_token_ids is not None else None
    explicit = "max_tokens" in params.model_fields_set
    max_tokens = fit_max_tokens(cap, params.max_tokens, explicit, prompt_tokens)
    try:
        job = JobRequest(
            job_id=job_id,
            model=cap.model,
            prompt=body.prompt,
            prompt_token_ids=body.prompt_token_ids,
            messages=body.messages,
            params=params.model_copy(update={"max_tokens": max_tokens}),
            priority=body.priority,
            metadata=body.metadata,
            include_spec=body.include_spec,
        )
    except ValidationError as exc:
        raise from_validation(exc) from None
    except ValueError as exc:
        raise APIError.of(ErrorCode.BAD_REQUEST, str(exc)) from None
    check_processors(params)
    constraints.check(params.structured, "params.structured")
    url = webhooks.check_url(body.webhook_url)
    # include_spec is how the tokens are delivered, not what is asked: a retry may differ.
    fp = fingerprint("jobs", body.model_dump(mode="json", exclude={"id", "include_spec"}))
    return Prepared(job, fp, not stable, url)


@router.get("/v1/jobs")
async def list_jobs(
    request: Request,
    status: str | None = Query(default=None, max_length=32),
    limit: int = Query(default=20, ge=1, le=100),
    after: str | None = Query(default=None, max_length=128),
) -> dict[str, Any]:
    """The caller's jobs, newest first; ``after`` (a job id from the last page) continues."""
    if status is not None and status not in {s.value for s in JobStatus}:
        raise APIError.of(
            ErrorCode.BAD_REQUEST,
            f"status must be one of {', '.join(s.value for s in JobStatus)}",
            param="status",
        )
    return await listing.jobs_page(_store(request), owner(request), status, limit, after)


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
                    yield sse.event(ev.id, ev.msg.kind, public(ev.msg))
        except (RedisError, OSError) as exc:  # no id: a reconnect resumes after the last real event
            yield f"event: error\ndata: {json.dumps(store_down(exc).body())}\n\n"

    return sse.response(body())


def public(msg: Message) -> dict[str, Any]:
    """An event as its job-API client sees it: a token event's ``spec`` only when asked for
    (so a client that did not ask gets the same bytes as before it existed)."""
    if isinstance(msg, TokenEvent) and msg.spec is None:
        return msg.model_dump(mode="json", exclude={"spec"})
    return msg.model_dump(mode="json")


@router.delete("/v1/jobs/{job_id}", response_model=None)
async def cancel(job_id: str, request: Request) -> Response:
    status = await _store(request).cancel(job_id, owner(request))
    code = 202 if status == "cancelling" else 200
    return JSONResponse({"id": job_id, "status": status}, status_code=code)
