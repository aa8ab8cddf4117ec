"""Following a submitted job for an OpenAI request: deadline, client disconnect, errors.

- Non-streaming: wait for the final event while watching for the client to leave; a client
  that leaves cancels its job; past ``request_timeout_s`` the job is cancelled and the
  answer is a 504 ``timeout``.
- Streaming: the 200 and its headers wait for the job's first event, so a job the worker
  refuses (an ErrorEvent first: context length, bad request) is a proper 4xx JSON error.
  Then every stream ends with ``data: [DONE]``: after the finish, or after an error chunk
  (OpenAI's error shape in ``data:``) when the job fails, the deadline passes or Redis fails.
- A Redis outage shorter than ``outage_grace_s`` is ridden out: the client keeps its
  connection and gets every event once (gateway/outage.py). A longer one is a 503 with
  Retry-After (or, once streaming, an error chunk) and cancels the job, the cancel written
  once Redis answers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import anyio
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from redis.exceptions import RedisError

from gateway import sse
from gateway.errors import APIError, error_body, error_status, store_down
from gateway.outage import Outage
from gateway.responses import ResponseBuilder
from gateway.store import JobStore, StoredEvent
from shared.errors import ErrorCode
from shared.schemas import ErrorEvent, FinishEvent, TokenEvent

T = TypeVar("T")
_TIMED_OUT = "timed out"


class ClientGone(Exception):
    """The client closed its connection before the answer."""


def _timeout(job_id: str, seconds: float) -> APIError:
    return APIError.of(ErrorCode.TIMEOUT, f"request timed out after {seconds:g}s; job {job_id} was cancelled")


async def cancel_quietly(store: JobStore, job_id: str) -> None:
    """Cancel the job now or, with Redis down, once it is back (``JobStore.cancel_soon``)."""
    await store.cancel_soon(job_id)


def outage_error(store: JobStore, job_id: str, exc: BaseException) -> APIError:
    """The 503 of a request whose Redis stayed away past the grace period (its job is cancelled)."""
    grace = store.settings.outage_grace_s
    err = store_down(exc)
    err.message = f"{err.message}; unreachable for more than {grace:g}s, so job {job_id} was cancelled"
    return err


async def _race(request: Request, work: Callable[[], Awaitable[T]], timeout_s: float) -> T:
    """``work()``, unless the client disconnects first (ClientGone) or ``timeout_s`` passes
    (TimeoutError)."""
    result: list[T] = []
    gone = False

    async def watch(scope: anyio.CancelScope) -> None:
        nonlocal gone
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                gone = True
                scope.cancel()
                return

    try:
        with anyio.move_on_after(timeout_s):
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch, tg.cancel_scope)
                result.append(await work())  # in this task: one task spawned, not two
                tg.cancel_scope.cancel()
    except BaseExceptionGroup as group:  # the work failed (e.g. Redis): that failure, unwrapped
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise
    if result:
        return result[0]
    if gone:
        raise ClientGone
    raise TimeoutError


async def final_event(store: JobStore, job_id: str, until: float | None = None) -> FinishEvent | ErrorEvent:
    """The job's final event, through a Redis outage of up to the grace period (past it,
    the Redis error)."""
    async for ev in store.events(job_id, block_s=store.settings.keepalive_s, until=until, final_only=True):
        if ev is not None and isinstance(ev.msg, FinishEvent | ErrorEvent):
            return ev.msg
    # Over without a final event on the stream (it expired): the job record has the result.
    with Outage(store.settings.outage_grace_s, f"job {job_id}", store.outages) as outage:
        stored = await outage.ride(lambda: store.result(job_id))
    if stored is not None:
        return stored
    return ErrorEvent(job_id=job_id, code=ErrorCode.INTERNAL, message="the job ended without a result")


def _error_response(ev: ErrorEvent) -> JSONResponse:
    status = error_status(ev.code)
    return JSONResponse(error_body(status, ev.message, code=ev.code), status_code=status)


async def complete(request: Request, store: JobStore, job_id: str, out: ResponseBuilder) -> Response:
    """The whole answer of a non-streaming request."""
    timeout_s = store.settings.request_timeout_s
    try:
        final = await _race(request, lambda: final_event(store, job_id), timeout_s)
    except ClientGone:
        await cancel_quietly(store, job_id)
        return Response(status_code=499)  # nobody reads it
    except TimeoutError:
        await cancel_quietly(store, job_id)
        raise _timeout(job_id, timeout_s) from None
    except (RedisError, OSError) as exc:  # Redis away past the grace period
        await cancel_quietly(store, job_id)
        raise outage_error(store, job_id, exc) from None
    if isinstance(final, ErrorEvent):
        return _error_response(final)
    return JSONResponse(out.full(final))


async def stream(request: Request, store: JobStore, job_id: str, out: ResponseBuilder) -> Response:
    """A streamed answer; its headers wait for the job's first event."""
    timeout_s = store.settings.request_timeout_s
    until = anyio.current_time() + timeout_s
    events = store.events(job_id, block_s=store.settings.keepalive_s, until=until)

    async def first() -> StoredEvent | str | None:
        async for ev in events:
            if ev is not None:
                return ev
            if anyio.current_time() >= until:
                return _TIMED_OUT
        return None

    try:
        got = await _race(request, first, timeout_s)
        if isinstance(got, str):
            raise TimeoutError
        ev = got
    except ClientGone:
        await cancel_quietly(store, job_id)
        return Response(status_code=499)
    except TimeoutError:
        await cancel_quietly(store, job_id)
        raise _timeout(job_id, timeout_s) from None
    except (RedisError, OSError) as exc:  # Redis away past the grace period, before the first event
        await cancel_quietly(store, job_id)
        raise outage_error(store, job_id, exc) from None
    if ev is None:
        final = await final_event(store, job_id)
        if isinstance(final, ErrorEvent):
            return _error_response(final)
        ev = StoredEvent("0-0", final)
    elif isinstance(ev.msg, ErrorEvent):
        return _error_response(ev.msg)
    return sse.response(_chunks(store, job_id, out, ev, events, until, timeout_s))


async def _chunks(
    store: JobStore,
    job_id: str,
    out: ResponseBuilder,
    first: StoredEvent,
    rest: AsyncIterator[StoredEvent | None],
    until: float,
    timeout_s: float,
) -> AsyncIterator[str]:
    """Chunks of a streamed completion; a client that goes away cancels its job."""
    ended = False

    async def chain() -> AsyncIterator[StoredEvent | None]:
        yield first
        if not isinstance(first.msg, FinishEvent | ErrorEvent):
            async for ev in rest:
                yield ev

    try:
        echoed = out.echo_chunk(0)
        if echoed is not None:
            yield sse.data(echoed)
        async for ev in chain():
            if ev is not None:
                out.observe(0, ev.msg)
            if ev is None:
                if anyio.current_time() >= until:
                    yield sse.data(_timeout(job_id, timeout_s).body())
                    yield sse.DONE
                    return  # finally cancels the job
                yield sse.KEEPALIVE
            elif isinstance(ev.msg, TokenEvent):
                for chunk in out.token_chunks(0, ev.msg):
                    yield sse.data(chunk)
            elif isinstance(ev.msg, FinishEvent):
                ended = True
                for chunk in out.finish_chunks(0, ev.msg):
                    yield sse.data(chunk)
                if out.include_usage:
                    yield sse.data(out.usage_chunk(ev.msg))
                yield sse.DONE
                return
            elif isinstance(ev.msg, ErrorEvent):
                ended = True
                yield sse.data(error_body(error_status(ev.msg.code), ev.msg.message, code=ev.msg.code))
                yield sse.DONE
                return
        # The stream ended without a final event: the job is over or gone.
        ended = True
        final = await final_event(store, job_id)
        if isinstance(final, FinishEvent):
            for chunk in out.finish_chunks(0, final):
                yield sse.data(chunk)
        else:
            yield sse.data(error_body(error_status(final.code), final.message, code=final.code))
        yield sse.DONE
    except (RedisError, OSError) as exc:  # Redis away past the grace period: finally cancels the job
        yield sse.data(outage_error(store, job_id, exc).body())
        yield sse.DONE
    finally:
        if not ended:
            await cancel_quietly(store, job_id)
