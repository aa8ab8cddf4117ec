"""The drivers. Open loop: send each planned request at its arrival time, whatever the state
of earlier ones (a closed loop would slow its arrivals down exactly when the server is
overloaded and hide the overload), so latencies are the measure. Closed loop: each phase's N
users send a request, wait for its answer, send the next, until the phase ends; the next
phase starts once the last of them is answered, so the load adapts to the server, no phase
inherits another's backlog, and tokens/s measures its capacity at that concurrency."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import anyio
import httpx

from benchmarks.load.client import ClientOptions, RequestRecord, send
from benchmarks.load.phases import Window
from benchmarks.load.plan import ClosedLoopPlan, Plan, PlannedRequest

Progress = Callable[[RequestRecord], None]


@dataclass
class DriveResult:
    t0: float  # perf_counter at the run's start: the records' times are seconds after it
    t0_wall: float  # time.time() at the same instant, to place telemetry on the same clock
    records: list[RequestRecord]
    windows: list[Window] | None = None  # closed loop: where each phase really ran


def new_client(base_url: str, timeout_s: float) -> httpx.AsyncClient:
    # Each in-flight stream holds a connection: no pool cap, or arrivals would queue here.
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    return httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(timeout_s, connect=10.0), limits=limits)


async def drive(
    client: httpx.AsyncClient,
    plan: list[PlannedRequest],
    opts: ClientOptions,
    *,
    drain_timeout_s: float,
    on_done: Progress | None = None,
) -> DriveResult:
    """Replay ``plan``; returns the run's clock and one record per request.

    Requests still open ``drain_timeout_s`` after the last arrival are cancelled and
    recorded with the error "timeout".
    """
    records = [RequestRecord(r.index, r.window, r.arrival_s, r.max_tokens) for r in plan]
    last_arrival = plan[-1].arrival_s if plan else 0.0
    t0, t0_wall = time.perf_counter(), time.time()

    async def one(req: PlannedRequest, rec: RequestRecord) -> None:
        await send(client, req, opts, t0, rec)
        if on_done is not None:
            on_done(rec)

    with anyio.move_on_after(last_arrival + drain_timeout_s):
        async with anyio.create_task_group() as tg:
            for req, rec in zip(plan, records, strict=True):
                delay = t0 + req.arrival_s - time.perf_counter()
                if delay > 0:
                    await anyio.sleep(delay)
                tg.start_soon(one, req, rec)
    for rec in records:
        if rec.end_s is None and rec.error is None:
            rec.error = "timeout" if rec.sent_s is not None else "not sent (timeout)"
    return DriveResult(t0, t0_wall, records)


async def drive_closed(
    client: httpx.AsyncClient,
    plan: ClosedLoopPlan,
    opts: ClientOptions,
    *,
    drain_timeout_s: float,
    on_done: Progress | None = None,
) -> DriveResult:
    """Run the windows one after another: each window's users send requests for its duration,
    then the window's last answers are awaited before the next window starts, so no phase
    inherits another's backlog. ``windows`` of the result are where each phase really ran
    ([start, start + duration)); requests still open ``drain_timeout_s`` after their window
    ended are cancelled and recorded with the error "timeout"."""
    records: list[RequestRecord] = []
    ran: list[Window] = []
    t0, t0_wall = time.perf_counter(), time.time()

    async def user(w: Window, sent: list[int]) -> None:
        while (now := time.perf_counter() - t0) < w.end_s:
            k, sent[0] = sent[0], sent[0] + 1
            req = plan.request(w, k, len(records), now)
            rec = RequestRecord(req.index, w.index, now, req.max_tokens)
            records.append(rec)
            await send(client, req, opts, t0, rec)
            if on_done is not None:
                on_done(rec)
            if not rec.ok:  # a failing server must not be hammered in a tight loop
                await anyio.sleep(0.05)

    for nominal in plan.windows:
        start = time.perf_counter() - t0
        w = replace(nominal, start_s=start, end_s=start + nominal.phase.duration_s)
        ran.append(w)
        with anyio.move_on_after(nominal.phase.duration_s + drain_timeout_s):
            async with anyio.create_task_group() as tg:
                sent = [0]
                for _ in range(w.phase.users):
                    tg.start_soon(user, w, sent)
    for rec in records:
        if rec.end_s is None and rec.error is None:
            rec.error = "timeout" if rec.sent_s is not None else "not sent (timeout)"
    return DriveResult(t0, t0_wall, records, ran)


async def drive_plan(
    client: httpx.AsyncClient, plan: Plan, opts: ClientOptions, *, drain_timeout_s: float,
    on_done: Progress | None = None,
) -> DriveResult:  # fmt: skip
    """The closed-loop or the open-loop driver, as the plan is."""
    if isinstance(plan, ClosedLoopPlan):
        return await drive_closed(client, plan, opts, drain_timeout_s=drain_timeout_s, on_done=on_done)
    return await drive(client, plan, opts, drain_timeout_s=drain_timeout_s, on_done=on_done)


async def warm_up(client: httpx.AsyncClient, reqs: list[PlannedRequest], opts: ClientOptions) -> list[str]:
    """Send the warm-up requests together; returns the errors (empty when all went through)."""
    t0 = time.perf_counter()
    records = [RequestRecord(r.index, r.window, 0.0, r.max_tokens) for r in reqs]
    async with anyio.create_task_group() as tg:
        for req, rec in zip(reqs, records, strict=True):
            tg.start_soon(send, client, req, opts, t0, rec)
    return [rec.error for rec in records if rec.error is not None]
