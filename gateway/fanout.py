"""Following a request whose choices are several jobs (``n`` > 1, a list of prompts).

Each choice is one job; the answer gathers them in choice order. The same promises as a
single job's (gateway/follow.py): a client that leaves, a deadline that passes, or a Redis
outage longer than the grace period cancels every unfinished job (a shorter one is ridden
out); a stream's headers wait for the first event, so a refused request is
a 4xx JSON error; a choice that fails ends the request with its error (the others are
cancelled); every stream ends with ``data: [DONE]``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import anyio
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from redis.exceptions import RedisError

from gateway import sse
from gateway.dedup import SentMark
from gateway.errors import APIError, error_body, error_status
from gateway.follow import ClientGone, _error_response, _race, _timeout, cancel_quietly, outage_error
from gateway.metrics import EventTap
from gateway.outage import Outage
from gateway.responses import ResponseBuilder
from gateway.store import JobStore
from shared import codec, keys
from shared.errors import ErrorCode
from shared.schemas import ErrorEvent, FinishEvent, Message, TokenEvent
from shared.streams import id_str

Event = tuple[int, Message] | None


async def choice_events(
    store: JobStore, job_ids: list[str], block_s: float = 15.0, until: float | None = None
) -> AsyncIterator[tuple[int, Message] | None]:
    """The events of several jobs of one model (a request's choices) as they come, as
    (choice index, event), in one XREAD over their streams; each job's stream ends with
    its final event (from the record when the stream expired). Yields None whenever
    ``block_s`` passes without an event, and by ``until`` at the latest. Rides out a Redis
    outage of up to the grace period, resuming after the last event of each choice
    (gateway/outage.py); a longer one raises its Redis error."""
    tap = EventTap(store)  # request metrics (gateway/metrics.py)
    what = f"job {job_ids[0]} and its other choices"
    with Outage(store.settings.outage_grace_s, what, store.outages) as outage:
        async for ev in _choice_events(store, job_ids, block_s, until, tap, outage):
            yield ev


async def _choice_events(
    store: JobStore, job_ids: list[str], block_s: float, until: float | None, tap: EventTap, outage: Outage
) -> AsyncIterator[tuple[int, Message] | None]:
    open_: dict[str, int] = {}
    for i, j in enumerate(job_ids):
        m = await outage.ride(partial(store.model_of, j))
        if m is None:
            yield i, ErrorEvent(job_id=j, code=ErrorCode.JOB_NOT_FOUND, message=f"no job {j}")
            continue
        open_[keys.job_events(m, j)] = i
    cursors = dict.fromkeys(open_, "0-0")
    # Each choice's output positions are sent once, across outages too (gateway/dedup.py).
    marks = {stream: SentMark(primed=True) for stream in open_}
    quiet_since = anyio.current_time()
    while open_:
        wait_s = block_s if until is None else min(block_s, until - anyio.current_time())
        try:
            got = await _next(store, job_ids, open_, cursors, max(1, int(wait_s * 1000)))
        except (RedisError, OSError) as exc:
            wait = outage.failed(exc)  # raises past the grace period
            if outage.keepalive_due(quiet_since, block_s, until):
                quiet_since = anyio.current_time()
                yield None
            await anyio.sleep(wait)
            continue
        outage.recovered()
        quiet_since = anyio.current_time()
        if not got:
            yield None
        for stream, entry_id, msg in got:  # (read whole before any is yielded: nothing half-done)
            i = open_[stream]
            if entry_id is not None:
                cursors[stream] = entry_id
            if msg is None:
                continue  # not ours to judge; the worker wrote it
            new = marks[stream].unseen(msg)
            if new is None:
                continue  # sent already: a re-run wrote these positions again
            if entry_id is not None:
                await tap.see(job_ids[i], entry_id, new)
            yield i, new
            if isinstance(msg, FinishEvent | ErrorEvent):
                del open_[stream]


async def _next(
    store: JobStore, job_ids: list[str], open_: dict[str, int], cursors: dict[str, str], block_ms: int
) -> list[tuple[str, str | None, Message | None]]:
    """The next entries of the open streams as (stream, entry id, event or None when it does
    not decode), each stream's up to its final event; empty when ``block_ms`` passed without
    one. A stream whose job is over without a final event on it gets the record's (entry id
    None). Changes nothing: the caller moves the cursors once it has them all."""
    resp = await store.r.xread({s: cursors[s] for s in open_}, count=256, block=block_ms)
    got = _by_stream(resp)
    out: list[tuple[str, str | None, Message | None]] = []
    if not got:
        for stream, i in open_.items():
            if not await store.ended(job_ids[i]):
                continue
            # One non-blocking read more: the final event may have just landed.
            rest = await store.r.xrange(stream, min="(" + cursors[stream], max="+")
            tail = _decoded(stream, rest or [])
            if any(isinstance(msg, FinishEvent | ErrorEvent) for _, _, msg in tail):
                out += tail
            else:
                final = await store.result(job_ids[i])
                lost = ErrorEvent(job_id=job_ids[i], code=ErrorCode.INTERNAL,
                                  message="the job ended without a result")  # fmt: skip
                out += [*tail, (stream, None, final or lost)]
        return out
    for stream, items in got:
        if stream in open_:
            out += _decoded(stream, items)
    return out


def _decoded(stream: str, items: list[Any]) -> list[tuple[str, str | None, Message | None]]:
    """(stream, entry id, event) of ``items`` up to the first final event (None: it does not
    decode; the cursor still moves past it)."""
    out: list[tuple[str, str | None, Message | None]] = []
    for entry_id, fields in items:
        msg: Message | None
        try:
            msg = codec.from_entry(dict(fields or {}))
        except codec.CodecError:
            msg = None
        out.append((stream, id_str(entry_id), msg))
        if isinstance(msg, FinishEvent | ErrorEvent):
            break
    return out


def _by_stream(resp: Any) -> list[tuple[str, list[Any]]]:
    """(stream name, entries) of an XREAD reply (RESP2 pairs or a RESP3 map)."""
    if not resp:
        return []
    pairs = list(resp.items()) if isinstance(resp, dict) else [(name, items) for name, items in resp]
    return [(id_str(name), [e for e in items if e[1] is not None]) for name, items in pairs]


async def _cancel_all(store: JobStore, job_ids: list[str], done: set[int]) -> None:
    for i, job_id in enumerate(job_ids):
        if i not in done:
            await cancel_quietly(store, job_id)


async def complete(request: Request, store: JobStore, job_ids: list[str], out: ResponseBuilder) -> Response:
    """The whole answer: every choice's final event, in order."""
    timeout_s = store.settings.request_timeout_s
    finals: dict[int, FinishEvent | ErrorEvent] = {}

    async def gather() -> None:
        async for ev in choice_events(store, job_ids, block_s=store.settings.keepalive_s):
            if ev is None:
                continue
            i, msg = ev
            if isinstance(msg, FinishEvent | ErrorEvent):
                finals[i] = msg
                if isinstance(msg, ErrorEvent):
                    return
        return

    try:
        await _race(request, gather, timeout_s)
    except ClientGone:
        await _cancel_all(store, job_ids, set(finals))
        return Response(status_code=499)
    except TimeoutError:
        await _cancel_all(store, job_ids, set(finals))
        raise _timeout(job_ids[0], timeout_s) from None
    except (RedisError, OSError) as exc:  # Redis away past the grace period
        await _cancel_all(store, job_ids, set(finals))
        raise outage_error(store, job_ids[0], exc) from None
    failed = [f for f in finals.values() if isinstance(f, ErrorEvent)]
    if failed or len(finals) < len(job_ids):
        await _cancel_all(store, job_ids, set(finals))
        err = failed[0] if failed else _lost(job_ids[0])
        return _error_response(err)
    ordered = [finals[i] for i in range(len(job_ids))]
    return JSONResponse(out.full([f for f in ordered if isinstance(f, FinishEvent)]))


def _lost(job_id: str) -> ErrorEvent:
    return ErrorEvent(job_id=job_id, code=ErrorCode.INTERNAL, message="a choice ended without a result")


async def stream(request: Request, store: JobStore, job_ids: list[str], out: ResponseBuilder) -> Response:
    """A streamed answer whose chunks carry their choice's index; the headers wait for the
    first event of any choice."""
    timeout_s = store.settings.request_timeout_s
    until = anyio.current_time() + timeout_s
    events = choice_events(store, job_ids, block_s=store.settings.keepalive_s, until=until)

    async def first() -> tuple[int, Message] | None:
        async for ev in events:
            if ev is not None:
                return ev
            if anyio.current_time() >= until:
                raise TimeoutError
        return None

    try:
        got = await _race(request, first, timeout_s)
    except ClientGone:
        await _cancel_all(store, job_ids, set())
        return Response(status_code=499)
    except TimeoutError:
        await _cancel_all(store, job_ids, set())
        raise _timeout(job_ids[0], timeout_s) from None
    except (RedisError, OSError) as exc:  # Redis away past the grace period, before the first event
        await _cancel_all(store, job_ids, set())
        raise outage_error(store, job_ids[0], exc) from None
    if got is None:
        return _error_response(_lost(job_ids[0]))
    if isinstance(got[1], ErrorEvent):
        await _cancel_all(store, job_ids, {got[0]})
        return _error_response(got[1])
    return sse.response(_chunks(store, job_ids, out, got, events, until, timeout_s))


async def _chunks(
    store: JobStore,
    job_ids: list[str],
    out: ResponseBuilder,
    head: tuple[int, Message],
    rest: AsyncIterator[Event],
    until: float,
    timeout_s: float,
) -> AsyncIterator[str]:
    done: set[int] = set()
    finals: dict[int, FinishEvent] = {}

    async def chain() -> AsyncIterator[Event]:
        yield head
        async for ev in rest:
            yield ev

    try:
        for i in range(len(job_ids)):
            echoed = out.echo_chunk(i)
            if echoed is not None:
                yield sse.data(echoed)
        async for ev in chain():
            if ev is None:
                if anyio.current_time() >= until:
                    yield sse.data(_timeout(job_ids[0], timeout_s).body())
                    yield sse.DONE
                    return  # finally cancels the rest
                yield sse.KEEPALIVE
                continue
            i, msg = ev
            out.observe(i, msg)
            if isinstance(msg, TokenEvent):
                for chunk in out.token_chunks(i, msg):
                    yield sse.data(chunk)
            elif isinstance(msg, FinishEvent):
                done.add(i)
                finals[i] = msg
                for chunk in out.finish_chunks(i, msg):
                    yield sse.data(chunk)
            elif isinstance(msg, ErrorEvent):
                done.add(i)
                yield sse.data(error_body(error_status(msg.code), msg.message, code=msg.code))
                yield sse.DONE
                return
            if len(finals) == len(job_ids):
                if out.include_usage:
                    yield sse.data(out.usage_chunk([finals[k] for k in range(len(job_ids))]))
                yield sse.DONE
                return
        err = APIError.of(ErrorCode.INTERNAL, "a choice ended without a result")
        yield sse.data(err.body())
        yield sse.DONE
    except (RedisError, OSError) as exc:  # Redis away past the grace period: finally cancels the rest
        yield sse.data(outage_error(store, job_ids[0], exc).body())
        yield sse.DONE
    finally:
        await _cancel_all(store, job_ids, done)
