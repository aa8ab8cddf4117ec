"""OpenAI-compatible routes: /v1/completions, /v1/chat/completions, /v1/models[/{id}].

Each choice is one job on the model's stream: ``n`` choices per prompt (choice k samples
from seed + k), a list of prompts on /v1/completions (choices in prompt order).

An ``Idempotency-Key`` header makes a retried request follow the job the first attempt made
(its result, or its stream from the start) instead of running a second one.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Header, Request
from fastapi.responses import Response
from pydantic import ValidationError

from gateway import fanout, follow
from gateway.auth import owner
from gateway.errors import APIError, from_validation
from gateway.ids import fingerprint, idempotent_job_id, new_job_id
from gateway.openai_schema import MAX_N, ChatRequest, CompletionRequest
from gateway.responses import ResponseBuilder
from gateway.settings import GatewaySettings
from gateway.store import JobStore
from gateway.submission import capacity, fit_max_tokens, model_not_found
from shared.control import WorkerInfo
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
    body.check_supported()
    prompts = body.prompt_inputs()
    if body.echo and body.logprobs is None and any("prompt" not in p for p in prompts):
        raise APIError.of(  # a token-id prompt's echo is its tokens' texts from its prompt logprobs
            ErrorCode.BAD_REQUEST,
            "echo of token-id prompts needs logprobs (this gateway has no tokenizer)",
            param="echo",
        )
    explicit = body.max_tokens is not None
    return await _serve(
        request,
        "completions",
        body,
        prompts,
        1 if body.echo_only else body.max_tokens or COMPLETIONS_DEFAULT_MAX_TOKENS,
        explicit,
        idempotency_key,
        echo=body.echo,
    )


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(
    body: ChatRequest,
    request: Request,
    idempotency_key: str | None = Header(default=None, alias="Idempotency-Key"),
) -> Response:
    body.check_supported()
    given = body.max_completion_tokens or body.max_tokens
    max_tokens = given or _settings(request).default_max_tokens
    inputs = [{"messages": body.chat_messages(), "tools": body.template_tools()}]
    return await _serve(request, "chat", body, inputs, max_tokens, given is not None, idempotency_key)


def _model_card(name: str, workers: list[WorkerInfo]) -> dict[str, Any]:
    lens = [w.max_model_len for w in workers if w.max_model_len > 0]
    return {
        "id": name,
        "object": "model",
        "created": int(min(w.started_at for w in workers)),
        "owned_by": "nightjar",
        "root": name,
        "parent": None,
        "max_model_len": min(lens) if lens else None,
    }


async def _served(request: Request) -> dict[str, list[WorkerInfo]]:
    by_model: dict[str, list[WorkerInfo]] = {}
    for w in await _store(request).registry.workers():
        by_model.setdefault(w.model, []).append(w)
    return by_model


@router.get("/v1/models")
async def models(request: Request) -> dict[str, Any]:
    """Models with at least one live worker, with their context (``max_model_len``)."""
    served = await _served(request)
    return {"object": "list", "data": [_model_card(n, ws) for n, ws in sorted(served.items())]}


@router.get("/v1/models/{model_id:path}")
async def model(model_id: str, request: Request) -> dict[str, Any]:
    workers = (await _served(request)).get(model_id)
    if not workers:
        raise model_not_found(model_id)
    return _model_card(model_id, workers)


def _choice_ids(base: str, count: int) -> list[str]:
    return [base] if count == 1 else [f"{base}-{k}" for k in range(count)]


def _choice_seed(seed: int | None, k: int) -> int | None:
    """Choice k of a prompt samples from seed + k (choice 0 keeps the request's seed)."""
    return None if seed is None else (seed + k) % (2**63)


async def _serve(
    request: Request,
    route: str,
    body: CompletionRequest | ChatRequest,
    prompts: list[dict[str, Any]],
    max_tokens: int,
    explicit: bool,
    idempotency_key: str | None,
    *,
    echo: bool = False,
) -> Response:
    store = _store(request)
    who = owner(request)
    stable_id = idempotent_job_id(who, idempotency_key)
    base = stable_id or new_job_id()
    count = len(prompts) * body.n
    if count > MAX_N:
        raise APIError.of(
            ErrorCode.BAD_REQUEST, f"n × prompts is {count}; at most {MAX_N} choices per request", param="n"
        )
    job_ids = _choice_ids(base, count)
    cap = await capacity(store, job_ids[0] if stable_id else None, body.model)
    # The stream flag is how the answer is delivered, not what is asked: a retry may differ.
    fp = fingerprint(route, body.model_dump(mode="json", exclude={"stream", "stream_options"}))
    jobs: list[JobRequest] = []
    for p, inputs in enumerate(prompts):
        ids = inputs.get("prompt_token_ids")
        fitted = fit_max_tokens(cap, max_tokens, explicit, len(ids) if ids is not None else None)
        for k in range(body.n):
            params = body.sampling(fitted, _choice_seed(body.seed, k))
            job_id = job_ids[p * body.n + k]
            job = _job(job_id, cap.model, inputs, params, body.priority, body.metadata, body.stream)
            jobs.append(job.model_copy(update={"include_spec": body.include_spec}))
    submitted: list[str] = []
    try:
        for i, job in enumerate(jobs):
            fp_i = fp if i == 0 else f"{fp}:{i}"
            await store.submit(job, owner=who, fingerprint=fp_i, fresh=stable_id is None)
            submitted.append(job.job_id)
    except BaseException:
        for job_id in submitted:  # all or nothing: the choices admitted so far are withdrawn
            await follow.cancel_quietly(store, job_id)
        raise
    out = ResponseBuilder(
        route == "chat",
        base,
        cap.model,
        body.include_usage,
        continuous_usage=body.continuous_usage,
        prompt_logprobs=echo and body.logprobs_k() is not None,
        echo_only=isinstance(body, CompletionRequest) and body.echo_only,
        prompt_of=[i // body.n for i in range(count)],
        echo=[p.get("prompt") for p in prompts for _ in range(body.n)] if echo else None,
        tools=body.tool_output(base) if isinstance(body, ChatRequest) else None,
        spec=body.include_spec,
    )
    if count > 1:
        if body.stream:
            return await fanout.stream(request, store, job_ids, out)
        return await fanout.complete(request, store, job_ids, out)
    if body.stream:
        return await follow.stream(request, store, job_ids[0], out)
    return await follow.complete(request, store, job_ids[0], out)


def _job(
    job_id: str,
    model: str,
    inputs: dict[str, Any],
    params: Any,
    priority: int,
    metadata: dict[str, str] | None,
    stream: bool,
) -> JobRequest:
    # A non-streaming client awaits the result alone: the worker need not write every
    # step's tokens (a retry that streams still reads them, in coarser pieces).
    kind: Literal["delta", "final_only"] = "delta" if stream else "final_only"
    try:
        return JobRequest(
            job_id=job_id,
            model=model,
            params=params,
            priority=priority,
            metadata=metadata or {},
            output_kind=kind,
            **inputs,
        )
    except ValidationError as exc:
        err = from_validation(exc)
        if err.param and err.param.startswith("prompt_token_ids"):
            err.param = "prompt"
        raise err from None
    except ValueError as exc:
        raise APIError.of(ErrorCode.BAD_REQUEST, str(exc)) from None
