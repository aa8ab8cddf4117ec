"""Joining a job's token events: consecutive ones become one (positions in order, each once),
as a reader of the job's event stream, or a re-run's ``Resume``, expects. The outbox joins what
piled up while a write was in flight; a ``final_only`` job's held events are joined the same way."""

from __future__ import annotations

from shared.schemas import JobEvent, TokenEvent

_JOINED = {"job_id", "index", "token_ids", "text", "logprobs"}


def _joined(a: TokenEvent, b: TokenEvent) -> TokenEvent | None:
    """``a`` then ``b`` as one event, when ``b`` continues ``a`` (and carries nothing else)."""
    if b.index != a.index + len(a.token_ids) or (a.logprobs is None) != (b.logprobs is None):
        return None
    if b.model_dump(exclude=_JOINED, exclude_defaults=True):  # e.g. prompt_logprobs: its own event
        return None
    update: dict[str, object] = {"token_ids": a.token_ids + b.token_ids, "text": a.text + b.text}
    if a.logprobs is not None and b.logprobs is not None:
        update["logprobs"] = type(a.logprobs).join([a.logprobs, b.logprobs])
    return a.model_copy(update=update)


def coalesce(events: list[JobEvent]) -> list[JobEvent]:
    """A job's events with each run of consecutive token events joined into one."""
    out: list[JobEvent] = []
    for ev in events:
        last = out[-1] if out else None
        if isinstance(ev, TokenEvent) and isinstance(last, TokenEvent):
            joined = _joined(last, ev)
            if joined is not None:
                out[-1] = joined
                continue
        out.append(ev)
    return out
