"""Clients that keep going through a Redis failover, and what they saw.

- ``Submitter`` submits short jobs one after another, each with an Idempotency-Key, and
  retries a submit the gateway could not take (a 503 with Retry-After, or a connection that
  failed) with the same key — so a retry never makes a second job — up to ``max_tries``. It
  records every answer that was not a 2xx and how many tries each job took.
- ``follow`` reads a job's events over SSE and, when the stream breaks (an ``error`` event
  while Redis is away, or a dropped connection), reconnects with Last-Event-ID; it records
  every token position it was sent, so a test can check that no client saw a token twice.

Shared by the Redis Cluster and Sentinel suites. Pacing between retries is the client's
(Retry-After, capped); nothing here waits for a condition by sleeping.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

import anyio
import httpx

RETRY_CAP_S = 0.5  # a client honours Retry-After, up to this (the test's time is short)


@dataclass
class Submitter:
    gw: httpx.AsyncClient
    prompt: str
    max_tokens: int
    max_tries: int = 40
    accepted: dict[str, str] = field(default_factory=dict)  # job id -> prompt
    tries: list[int] = field(default_factory=list)  # tries each accepted job took
    refusals: list[str] = field(default_factory=list)  # "503+retry-after+json", "ReadError", ...
    gave_up: int = 0

    async def submit_one(self, i: int) -> None:
        key = f"failover-{uuid.uuid4().hex}"
        prompt = f"{self.prompt} {i}"
        body = {"prompt": prompt, "params": {"max_tokens": self.max_tokens, "ignore_eos": True}}
        for attempt in range(1, self.max_tries + 1):
            wait_s = RETRY_CAP_S
            try:
                resp = await self.gw.post("/v1/jobs", json=body, headers={"Idempotency-Key": key})
            except httpx.TransportError as exc:
                self.refusals.append(type(exc).__name__)
            else:
                if resp.status_code == 202:
                    self.accepted[resp.json()["id"]] = prompt
                    self.tries.append(attempt)
                    return
                answer = str(resp.status_code)
                answer += "+retry-after" if "retry-after" in resp.headers else ""
                answer += (
                    "+json" if resp.headers.get("content-type", "").startswith("application/json") else ""
                )
                self.refusals.append(answer)
                wait_s = min(RETRY_CAP_S, float(resp.headers.get("retry-after", RETRY_CAP_S)))
            await anyio.sleep(wait_s)  # the client's back-off (pacing, not a wait for a condition)
        self.gave_up += 1

    async def run(self, stop: anyio.Event) -> None:
        i = 0
        while not stop.is_set():
            await self.submit_one(i)
            i += 1


@dataclass
class Followed:
    job_id: str
    positions: list[int] = field(default_factory=list)  # every token position sent, in order
    tokens: dict[int, int] = field(default_factory=dict)
    reconnects: int = 0
    finished: bool = False

    @property
    def duplicated(self) -> int:
        return len(self.positions) - len(set(self.positions))


async def follow(gw: httpx.AsyncClient, job_id: str, timeout_s: float = 120.0) -> Followed:
    """A client of the job's SSE stream that reconnects (Last-Event-ID) until the job's final
    event."""
    seen = Followed(job_id)
    last_id: str | None = None
    deadline = time.monotonic() + timeout_s
    while not seen.finished and time.monotonic() < deadline:
        headers = {"Last-Event-ID": last_id} if last_id else {}
        kind = ""
        try:
            async with gw.stream("GET", f"/v1/jobs/{job_id}/events", headers=headers) as resp:
                if resp.status_code != 200:
                    raise httpx.TransportError(f"status {resp.status_code}")
                async for line in resp.aiter_lines():
                    if line.startswith("id: "):
                        last_id = line[4:]
                    elif line.startswith("event: "):
                        kind = line[7:]
                    elif line.startswith("data: ") and kind in ("token", "finish", "error"):
                        ev = json.loads(line[6:])
                        if kind == "token":
                            for pos, tok in enumerate(ev["token_ids"], start=ev["index"]):
                                seen.positions.append(pos)
                                seen.tokens.setdefault(pos, tok)
                        elif kind == "finish" or (kind == "error" and "code" in ev and "job_id" in ev):
                            seen.finished = True
        except httpx.TransportError:
            pass
        if not seen.finished:
            seen.reconnects += 1
            await anyio.sleep(0.25)  # the client's reconnect delay (SSE's retry)
    return seen


async def first_write_after(r: object, streams: list[str], t: float) -> float | None:
    """Seconds from wall time ``t`` to the first entry written after it on any of ``streams``
    (an entry id is its write time in ms): when the workers wrote again after a failover."""
    from tests.chaos.jobs import xrange

    after_ms = int(t * 1000)
    first: int | None = None
    for stream in streams:
        for entry_id, _ in await xrange(r, stream):  # type: ignore[arg-type]
            ms = int(entry_id.decode().split("-")[0])
            if ms > after_ms and (first is None or ms < first):
                first = ms
                break
    return None if first is None else first / 1000 - t
