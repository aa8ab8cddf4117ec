"""What every submit checks before the job is enqueued: a worker to run it, the model's
context, then the atomic admission (``JobStore.submit``).

- No live, non-draining worker (and ``require_worker``): 503 ``unavailable`` with
  Retry-After, rather than a job that waits for a worker that may never come.
- Context: the gateway has no tokenizer, so it checks what it can know: ``max_tokens``
  alone, or with ``prompt_token_ids``, against the smallest ``max_model_len`` of the serving
  workers (400 ``context_length_exceeded``, OpenAI's message). A ``max_tokens`` the client
  did not give is lowered to fit instead. The worker checks again after tokenizing.
- A job id already taken (a retry with the same Idempotency-Key or client id) skips the
  checks: the admission script returns the job that exists.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.errors import APIError
from gateway.store import JobStore
from shared.errors import ErrorCode

NO_WORKER_RETRY_AFTER_S = 5


def context_length_message(max_model_len: int, prompt_tokens: int, completion_tokens: int) -> str:
    """OpenAI's wording (the worker's ErrorEvent uses the same)."""
    return (
        f"This model's maximum context length is {max_model_len} tokens. However, you requested "
        f"{prompt_tokens + completion_tokens} tokens ({prompt_tokens} in the messages, "
        f"{completion_tokens} in the completion). Please reduce the length of the messages or completion."
    )


@dataclass(frozen=True)
class Capacity:
    model: str  # the served model the job goes to
    max_model_len: int  # 0: not known (no worker reports it)


def model_not_found(model: str) -> APIError:
    return APIError.of(ErrorCode.MODEL_NOT_FOUND, f"The model `{model}` does not exist.", param="model")


async def capacity(store: JobStore, job_id: str | None, requested: str | None = None) -> Capacity:
    """Which model serves the request, and its context (the smallest ``max_model_len`` of
    its serving workers).

    ``requested`` names a served model, or is omitted: then the only model served (400 when
    several are). A model no live worker serves is a 404 ``model_not_found``; while no
    worker at all is live it is a 503 (unless ``job_id`` already exists: a retry gets its
    job back whatever the workers do; or ``require_worker`` is off: the job waits for the
    model's first worker).
    """
    serving = await store.registry.serving()
    lens: dict[str, list[int]] = {}
    for w in serving:
        lens.setdefault(w.model, []).append(w.max_model_len)
    if job_id is not None and (bound := await store.model_of(job_id)) is not None:
        if requested and requested != bound:
            raise APIError.of(
                ErrorCode.CONFLICT, f"job id {job_id} is already used for another model", param="model"
            )
        if bound not in lens:
            return Capacity(bound, 0)
    name = requested or (next(iter(lens)) if len(lens) == 1 else "")
    if name in lens:  # the common case: no second read of the heartbeats
        known = [n for n in lens[name] if n > 0]
        return Capacity(name, min(known) if known else 0)
    live = {w.model for w in await store.registry.workers()}
    if not name:
        choices = sorted(lens) or sorted(live)
        if len(choices) > 1:
            raise APIError.of(
                ErrorCode.BAD_REQUEST,
                f"model is required: this server serves {', '.join(choices)}",
                param="model",
            )
        name = choices[0] if choices else store.settings.default_model  # (not in lens: it is empty)
    if store.settings.require_worker and (name in live or not live):
        # Its workers are all draining (it exists, takes no new jobs now), or none is live.
        raise APIError.of(
            ErrorCode.UNAVAILABLE,
            "no worker is available to run the request; retry shortly",
            retry_after=NO_WORKER_RETRY_AFTER_S,
        )
    if not name:
        raise APIError.of(ErrorCode.BAD_REQUEST, "model is required", param="model")
    if live and name not in live:
        raise model_not_found(name)
    return Capacity(name, 0)  # require_worker off and no worker yet: the job waits for one


def fit_max_tokens(cap: Capacity, max_tokens: int, explicit: bool, prompt_tokens: int | None) -> int:
    """``max_tokens`` checked (or, when not explicit, lowered) against the context."""
    n = cap.max_model_len
    if n <= 0:
        return max_tokens
    p = prompt_tokens or 0
    want = max_tokens if explicit else max(1, min(max_tokens, n - p))
    if p + want > n:
        raise APIError.of(
            ErrorCode.CONTEXT_LENGTH_EXCEEDED, context_length_message(n, p, want), param="messages"
        )
    return want
