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
from shared import keys
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
    max_model_len: int  # 0: not known (no worker reports it)


async def capacity(store: JobStore, job_id: str | None) -> Capacity:
    """Serving workers' context, or 503 when none serves (unless ``job_id`` already exists:
    a retry gets its job back whatever the workers do)."""
    serving = await store.serving_workers()
    if not serving and store.settings.require_worker:
        if job_id is not None and await store.r.exists(keys.job_key(job_id)):
            return Capacity(0)
        raise APIError.of(
            ErrorCode.UNAVAILABLE,
            "no worker is available to run the request; retry shortly",
            retry_after=NO_WORKER_RETRY_AFTER_S,
        )
    lens = [w.max_model_len for w in serving if w.max_model_len > 0]
    return Capacity(min(lens) if lens else 0)


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
