"""The gateway's metrics, request ids and ``/metrics`` (``install(app)``).

- ``Observe`` (the outermost ASGI middleware): takes the client's ``X-Request-Id`` or makes
  one, returns it on every response, sets ``shared.logs.REQUEST_ID`` while the request is
  served, and counts requests by route, method and status with their duration.
- ``MeteredStore`` (the app's JobStore): stamps each submitted job with the request id, and
  observes each job once, when the gateway first reads its final event (following a stream,
  waiting for a completion, or reading the job): TTFT, inter-token latency, end-to-end
  latency and queue time from the job's events (their stream entry ids are their times),
  prompt and generation tokens, and the finish reason; labelled by model and worker.
- ``/metrics``: the process view (shared/metrics.py), so under ``nightjar up`` it shows the
  worker's and the planner's metrics too. Also: requests riding out a Redis outage now and
  cancels waiting for Redis (gateway/outage.py).
- ``ApiMetrics``: vLLM's API-server families under their own names (vLLM counts requests with
  prometheus-fastapi-instrumentator): ``http_requests_total{handler, method, status}``, status
  as a class ("2xx"), and ``http_request_duration_seconds{handler, method}``, without the
  probe routes (/metrics, /health*), so vLLM's dashboards' HTTP panels work unchanged.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client import Histogram
from redis.exceptions import RedisError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.store import JobStore, StoredEvent, Submitted
from shared import metrics as m
from shared.logs import REQUEST_ID, accept_request_id
from shared.schemas import ErrorEvent, FinishEvent, JobRequest, StartEvent, TokenEvent
from shared.schemas import Message as WireMessage

MW = ("model", "worker")
REMEMBERED_JOBS = 100_000  # submit times and observed ids kept (oldest forgotten first)


class GatewayMetrics(m.MetricSet):
    def __init__(self) -> None:
        super().__init__()
        c, h = self.counter, self.histogram
        self.requests = c(
            "http_requests", "HTTP requests by route, method and status.", ("route", "method", "status")
        )
        self.duration = h(
            "http_request_duration_seconds",
            "HTTP request time, to the response's end.",
            ("route", "method"),
            m.E2E_BUCKETS,
        )
        self.in_flight = self.gauge("http_requests_in_flight", "HTTP requests being served.")
        self.ttft = h("time_to_first_token_seconds", "Submit to first token.", MW, m.TTFT_BUCKETS)
        self.itl = h("inter_token_latency_seconds", "Between consecutive output tokens.", MW, m.ITL_BUCKETS)
        self.e2e = h("e2e_request_latency_seconds", "Submit to the final event.", MW, m.E2E_BUCKETS)
        self.queue = h("request_queue_time_seconds", "Submit to a worker's start.", MW, m.E2E_BUCKETS)
        self.prompt_tokens = c("prompt_tokens", "Prompt tokens of finished requests.", MW)
        self.generation_tokens = c("generation_tokens", "Generated tokens of finished requests.", MW)
        self.success = c("request_success", "Finished requests by finish reason.", (*MW, "finished_reason"))
        self.failure = c("request_failure", "Failed requests by error code.", ("code",))


class ApiMetrics(m.MetricSet):
    prefix = ""  # vLLM's API server's names carry no prefix

    def __init__(self) -> None:
        super().__init__()
        self.requests = self.counter(
            "http_requests",
            "HTTP requests by handler, method and status class.",
            ("handler", "method", "status"),
        )
        self.duration = self.histogram(
            "http_request_duration_seconds", "HTTP request time.", ("handler", "method"), m.E2E_BUCKETS
        )


PROBES = ("/metrics", "/health")  # not counted in ApiMetrics (vLLM leaves its probes out too)


def _route(scope: Scope) -> str:
    route = scope.get("route")
    path = getattr(route, "path", None)
    return str(path) if path else "unmatched"  # never the raw path: unbounded label values


class Observe:
    """Request ids and request counts, outside every other middleware."""

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics, api: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics
        self.api = api

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = next((v for k, v in scope.get("headers", ()) if k == b"x-request-id"), None)
        rid = accept_request_id(given.decode("latin-1") if given is not None else None)
        token = REQUEST_ID.set(rid)
        method = str(scope.get("method", ""))
        started = time.perf_counter()
        status: list[int] = []

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                status.append(int(message["status"]))
                headers = [(k, v) for k, v in message.get("headers", ()) if k.lower() != b"x-request-id"]
                message = {**message, "headers": [*headers, (b"x-request-id", rid.encode())]}
                self.metrics.requests.labels(route=_route(scope), method=method, status=str(status[0])).inc()
            await send(message)

        self.metrics.in_flight.inc()
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            self.metrics.in_flight.dec()
            took = time.perf_counter() - started
            route = _route(scope)
            self.metrics.duration.labels(route=route, method=method).observe(took)
            if not route.startswith(PROBES):
                handler = route if route != "unmatched" else "none"
                status_class = f"{status[0] // 100}xx" if status else "5xx"
                self.api.requests.labels(handler=handler, method=method, status=status_class).inc()
                self.api.duration.labels(handler=handler, method=method).observe(took)
            REQUEST_ID.reset(token)


def _entry_time(entry_id: str) -> float | None:
    ms, _, _ = entry_id.partition("-")
    return int(ms) / 1000.0 if ms.isdigit() and ms != "0" else None


class MeteredStore(JobStore):
    """The gateway's JobStore, observing each job once as its final event is read."""

    def __init__(self, store: JobStore, metrics: GatewayMetrics) -> None:
        super().__init__(store.r, store.settings)
        self.metrics = metrics
        self._submitted: OrderedDict[str, float] = OrderedDict()
        self._observed: OrderedDict[str, None] = OrderedDict()

    async def submit(
        self,
        job: JobRequest,
        *,
        owner: str,
        fingerprint: str,
        max_queue: int | None = None,
        fresh: bool = False,
        batch: bool = False,
    ) -> Submitted:
        rid = REQUEST_ID.get()
        if job.request_id is None and rid is not None:
            job = job.model_copy(update={"request_id": rid})
        got = await super().submit(
            job, owner=owner, fingerprint=fingerprint, max_queue=max_queue, fresh=fresh, batch=batch
        )
        if got.created:
            _remember(self._submitted, job.job_id, job.created_at)
        return got

    async def submit_many(self, batch: list[tuple[JobRequest, str]], *, owner: str) -> list[Submitted]:
        rid = REQUEST_ID.get()
        if rid is not None:
            batch = [(j if j.request_id else j.model_copy(update={"request_id": rid}), fp) for j, fp in batch]
        got = await super().submit_many(batch, owner=owner)
        for (job, _), one in zip(batch, got, strict=True):
            if one.created:
                _remember(self._submitted, job.job_id, job.created_at)
        return got

    async def events(
        self,
        job_id: str,
        after: str = "0-0",
        block_s: float = 15.0,
        until: float | None = None,
        *,
        final_only: bool = False,
        history: bool = False,
    ) -> AsyncIterator[StoredEvent | None]:
        seen: list[StoredEvent] | None = [] if after == "0-0" else None
        # A final-only reader's timeline comes in the fetch of its final event (``history``);
        # the reader is given what it asked for.
        timeline = final_only and not history and seen is not None and job_id not in self._observed
        async for ev in super().events(
            job_id, after, block_s, until, final_only=final_only, history=history or timeline
        ):
            if ev is None:
                yield ev
                continue
            if seen is not None:
                seen.append(ev)
            if isinstance(ev.msg, FinishEvent | ErrorEvent):
                await self.observe(job_id, ev.msg, seen, _entry_time(ev.id))
            elif timeline:
                continue  # not asked for
            yield ev

    async def info(self, job_id: str, owner: str = "") -> dict[str, Any]:
        out = await super().info(job_id, owner)
        if job_id not in self._observed and (out["result"] or out["error"]):
            try:
                final: FinishEvent | ErrorEvent = (
                    FinishEvent.model_validate(out["result"])
                    if out["result"]
                    else ErrorEvent.model_validate(out["error"])
                )
            except ValueError:
                return out
            await self.observe(job_id, final, None, None)
        return out

    async def observe(
        self,
        job_id: str,
        final: FinishEvent | ErrorEvent,
        events: list[StoredEvent] | None,
        final_at: float | None,
    ) -> None:
        """Record one job's numbers (once per job); ``events``: all of its events, or None."""
        if job_id in self._observed:
            return
        _remember(self._observed, job_id, None)
        created = self._submitted.pop(job_id, None)
        if isinstance(final, ErrorEvent):
            self.metrics.failure.labels(code=final.code).inc()
            return
        worker = final.worker_id
        lb = {"model": await self._model_of(worker), "worker": worker}
        if created is None and final_at is not None and final.latency_s is not None:
            created = final_at - final.latency_s  # submitted by another gateway (or forgotten)
        self.metrics.success.labels(**lb, finished_reason=final.finish_reason).inc()
        self.metrics.prompt_tokens.labels(**lb).inc(final.prompt_tokens)
        self.metrics.generation_tokens.labels(**lb).inc(final.completion_tokens)
        if final.latency_s is not None:
            self.metrics.e2e.labels(**lb).observe(max(0.0, final.latency_s))
        elif created is not None and final_at is not None:
            self.metrics.e2e.labels(**lb).observe(max(0.0, final_at - created))
        if events is None or created is None:
            if final.ttft_s is not None:
                self.metrics.ttft.labels(**lb).observe(max(0.0, final.ttft_s))
            return
        self._timeline(lb, events, created, final.ttft_s)

    def _timeline(
        self, lb: dict[str, str], events: list[StoredEvent], created: float, ttft_s: float | None
    ) -> None:
        """Queue time, TTFT and inter-token latencies from the events' entry times. The TTFT
        is the worker's (``ttft_s``) when it gave one: a final_only job's first tokens are
        written later, in one piece with the ones after (worker/job_run.py ``feed``); the
        rest of that piece is spread from the first token to its write."""
        started = last = None
        itl: Histogram | None = None
        for ev in events:
            at = _entry_time(ev.id)
            if at is None:
                continue
            if isinstance(ev.msg, StartEvent) and started is None:
                started = at
                self.metrics.queue.labels(**lb).observe(max(0.0, at - created))
            elif isinstance(ev.msg, TokenEvent) and ev.msg.token_ids:
                n = len(ev.msg.token_ids)
                if last is None:
                    first = at - created if ttft_s is None else ttft_s
                    self.metrics.ttft.labels(**lb).observe(max(0.0, first))
                    n -= 1  # the first token's own latency is the TTFT
                    gap = max(0.0, at - created - first) / n if n else 0.0
                else:
                    gap = max(0.0, at - last) / n
                if n > 0:
                    if itl is None:  # one label lookup a job, not one a token
                        itl = self.metrics.itl.labels(**lb)
                    for _ in range(n):
                        itl.observe(gap)
                last = at

    async def _model_of(self, worker: str) -> str:
        try:
            served = {w.worker_id: w.model for w in await self.registry.serving()}
        except (RedisError, OSError):
            served = {}
        return served.get(worker, "")


class EventTap:
    """Observes jobs whose events are read outside ``MeteredStore.events`` (a request's
    several choices, read in one XREAD: gateway/fanout.py): feed it every event read."""

    def __init__(self, store: JobStore) -> None:
        self.store = store if isinstance(store, MeteredStore) else None
        self.seen: dict[str, list[StoredEvent]] = {}

    async def see(self, job_id: str, entry_id: str, msg: WireMessage) -> None:
        if self.store is None:
            return
        events = self.seen.setdefault(job_id, [])
        events.append(StoredEvent(entry_id, msg))
        if isinstance(msg, FinishEvent | ErrorEvent):
            del self.seen[job_id]
            await self.store.observe(job_id, msg, events, _entry_time(entry_id))


def _remember(d: OrderedDict[str, Any], key: str, value: Any) -> None:
    d[key] = value
    d.move_to_end(key)
    while len(d) > REMEMBERED_JOBS:
        d.popitem(last=False)


def install(app: FastAPI) -> GatewayMetrics:
    """Metrics, request ids and /metrics on the gateway app (call it last: its middleware
    must be the outermost, so every response carries the request id)."""
    metrics = GatewayMetrics()
    app.state.metrics = metrics
    app.state.api_metrics = api = ApiMetrics()
    store = app.state.store = MeteredStore(app.state.store, metrics)
    readers = metrics.gauge("redis_outage_readers", "Requests riding out a Redis outage now.")
    readers.set_function(lambda: store.outages.waiting)
    cancels = metrics.gauge("redis_outage_cancels_pending", "Cancels that wait for Redis to be written.")
    cancels.set_function(lambda: len(store.cancels))

    async def metrics_route(request: Request) -> Response:
        return Response(m.render_process(), media_type=m.CONTENT_TYPE)

    app.add_api_route("/metrics", metrics_route, methods=["GET"], include_in_schema=False)
    app.add_middleware(Observe, metrics=metrics, api=api)
    return metrics
