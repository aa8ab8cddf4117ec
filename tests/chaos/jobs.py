"""Submitting jobs and auditing what the workers wrote for them.

The audit reads a job's event stream straight from Redis (what every client would be sent)
and counts, per output position, how many token events wrote it: a correct run writes each
position exactly once, in order, and exactly one final (finish or error) event.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, cast

import httpx
import redis.asyncio as aioredis

from shared import codec, jobs, keys
from shared.control import Decision, WorkerInfo
from shared.schemas import ErrorEvent, FinishEvent, StartEvent, TokenEvent
from tests.chaos import names
from tests.e2e.conftest import poll
from tests.tiny_models import is_greedy, reference_greedy


@dataclass
class Audit:
    job_id: str
    tokens: dict[int, int] = field(default_factory=dict)  # position -> token id (first write)
    duplicated: int = 0  # writes of a position already written
    conflicting: int = 0  # of those, writes of a different token
    finals: int = 0
    final: FinishEvent | ErrorEvent | None = None
    final_ms: int | None = None  # the first final event's stream time (ms since the epoch)
    starts: list[tuple[str, int]] = field(default_factory=list)  # (worker, attempt)
    start_ms: list[int] = field(default_factory=list)  # each start event's stream time

    @property
    def gaps(self) -> int:
        return (max(self.tokens) + 1 - len(self.tokens)) if self.tokens else 0

    @property
    def token_ids(self) -> list[int]:
        return [self.tokens[i] for i in sorted(self.tokens)]

    @property
    def workers(self) -> list[str]:
        return [w for w, _ in self.starts]


async def audit(r: aioredis.Redis, job_id: str) -> Audit:
    a = Audit(job_id)
    seen: Counter[int] = Counter()
    for entry_id, fields in await xrange(r, names.job_events(job_id)):
        ev = codec.from_entry(fields)
        if isinstance(ev, StartEvent):
            a.starts.append((ev.worker_id, ev.attempt))
            a.start_ms.append(_ms(entry_id))
        elif isinstance(ev, TokenEvent):
            for pos, tok in enumerate(ev.token_ids, start=ev.index):
                seen[pos] += 1
                if seen[pos] > 1:
                    a.duplicated += 1
                    a.conflicting += a.tokens[pos] != tok
                else:
                    a.tokens[pos] = tok
        elif isinstance(ev, FinishEvent | ErrorEvent):
            a.finals += 1
            if a.final is None:
                a.final = ev
                a.final_ms = _ms(entry_id)
    return a


async def xrange(r: aioredis.Redis, stream: str) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """XRANGE with the types redis-py leaves loose."""
    return cast(list[tuple[bytes, dict[bytes, bytes]]], await r.xrange(stream))


async def latest_decision(r: aioredis.Redis) -> Decision:
    raw = await r.get(keys.DECISION_LATEST)
    assert isinstance(raw, bytes), "no decision published"
    return codec.decode_as(raw, Decision)


def worker_info(raw: object) -> WorkerInfo | None:
    return codec.decode_as(raw, WorkerInfo) if isinstance(raw, bytes) else None


def _ms(entry_id: bytes | str) -> int:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.split("-")[0])


async def submit(gw: httpx.AsyncClient, prompt: str, **params: Any) -> str:
    resp = await gw.post("/v1/jobs", json={"prompt": prompt, "params": params})
    assert resp.status_code == 202, resp.text
    job_id = resp.json()["id"]
    assert isinstance(job_id, str)
    return job_id


async def submit_all(gw: httpx.AsyncClient, prompts: list[str], **params: Any) -> dict[str, str]:
    """Submit every prompt at once (job id -> prompt): the workers see a burst, not a trickle.

    One at a time, a fast machine finishes each short job before the next arrives, so no
    worker ever runs several at once (CI's test_worker_sigkill_under_load waited 60 s for that).
    """
    ids = await asyncio.gather(*(submit(gw, p, **params) for p in prompts))
    return dict(zip(ids, prompts, strict=True))


async def ended(r: aioredis.Redis, job_ids: list[str]) -> set[str]:
    """The jobs whose record has a terminal status."""
    async with r.pipeline(transaction=False) as pipe:
        for j in job_ids:
            pipe.hget(names.job_key(j), jobs.STATUS)
        statuses = await pipe.execute()
    done = set()
    for j, raw in zip(job_ids, statuses, strict=True):
        try:
            st = jobs.status_of(raw)
        except ValueError:
            continue
        if st is not None and st in jobs.TERMINAL:
            done.add(j)
    return done


async def wait_all_ended(r: aioredis.Redis, job_ids: list[str], timeout_s: float, what: str) -> None:
    async def all_done() -> bool:
        return len(await ended(r, job_ids)) == len(job_ids)

    try:
        await poll(all_done, timeout_s, what, every_s=0.1)
    except AssertionError:
        missing = sorted(set(job_ids) - await ended(r, job_ids))
        raise AssertionError(
            f"timed out after {timeout_s}s: {len(missing)} job(s) never ended: {missing}"
        ) from None


@dataclass
class Tally:
    """The numbers one scenario reports."""

    jobs: int = 0
    lost: int = 0  # no final event
    duplicated: int = 0  # token positions written more than once, all jobs
    double_finals: int = 0  # final events beyond the first, all jobs
    gaps: int = 0
    wrong: int = 0  # greedy outputs that differ from the reference
    failed: int = 0  # final event is an error

    def clean(self) -> bool:
        return not (self.lost or self.duplicated or self.double_finals or self.gaps or self.wrong)


def tally(audits: list[Audit], expected: dict[str, list[int]] | None = None) -> Tally:
    t = Tally(jobs=len(audits))
    for a in audits:
        t.lost += a.final is None
        t.duplicated += a.duplicated
        t.double_finals += max(0, a.finals - 1)
        t.gaps += a.gaps
        t.failed += isinstance(a.final, ErrorEvent)
        if expected is not None and a.job_id in expected:
            got = a.final.token_ids if isinstance(a.final, FinishEvent) else None
            t.wrong += got != expected[a.job_id] or a.token_ids != expected[a.job_id]
    return t


# The prompts of the scenarios, shared so that each reference output is computed once
# (transformers' generate costs ~0.5 s a job here), while the cluster starts.
N_TOKENS = 48
PROMPTS = [f"The quick brown fox {i} jumps" if i % 2 else f"Once upon a time {i}" for i in range(20)]
LONG_N = 128  # the pause scenario: long enough to outlast the takeover
LONG_PROMPTS = [f"Speculative decoding {i} drafts tokens" for i in range(6)]
SHORT_N = 8
SHORT_PROMPTS = [f"Short job {i}" for i in range(12)]


def precompute_references(model_dir: Path) -> None:
    for prompts, n in ((PROMPTS, N_TOKENS), (LONG_PROMPTS, LONG_N), (SHORT_PROMPTS, SHORT_N)):
        for p in prompts:
            expected_greedy(model_dir, p, n)


@lru_cache(maxsize=4)
def _tokenizer(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


@lru_cache(maxsize=512)
def expected_greedy(model_dir: Path, prompt: str, n: int) -> list[int]:
    """transformers' greedy output for ``prompt`` (``ignore_eos``): the exactness oracle."""
    ids = _tokenizer(model_dir)(prompt)["input_ids"]
    return reference_greedy(model_dir, ids, n, ignore_eos=True)


def greedy_or_reference(model_dir: Path, prompt: str, n: int, got: list[int] | None) -> list[int]:
    """The oracle for long outputs: ``got`` itself when it is n tokens and each is the target's
    argmax up to a float tie (``tests.tiny_models.is_greedy``), else transformers' greedy output
    (which ``got`` then fails to equal)."""
    ids = _tokenizer(model_dir)(prompt)["input_ids"]
    if got is not None and len(got) == n and is_greedy(model_dir, ids, got):
        return got
    return expected_greedy(model_dir, prompt, n)


def greedy_oracles(
    model_dir: Path, prompts: dict[str, str], n_of: dict[str, int], audits: list[Audit]
) -> dict[str, list[int]]:
    """Each audited job's oracle (``greedy_or_reference``): its prompt from ``prompts``, its
    length from ``n_of``, keyed by job id as ``tally`` takes it."""
    return {
        a.job_id: greedy_or_reference(model_dir, prompts[a.job_id], n_of[a.job_id], a.token_ids)
        for a in audits
    }


async def unacked(r: aioredis.Redis) -> int:
    """Job entries delivered to a worker and not acknowledged yet."""
    return int((await r.xpending(names.jobs_stream(), names.JOBS_GROUP))["pending"])


async def wait_acked(r: aioredis.Redis, timeout_s: float = 15) -> None:
    async def none_pending() -> bool:
        return await unacked(r) == 0

    await poll(none_pending, timeout_s, "every job entry to be acknowledged", every_s=0.1)


@dataclass(frozen=True)
class Holding:
    worker: str
    status: str
    events: int  # entries on the job's event stream


async def holdings(r: aioredis.Redis, job_ids: list[str]) -> dict[str, Holding]:
    """Who runs each job and how far it got, in one round trip (cheap enough to poll)."""
    async with r.pipeline(transaction=False) as pipe:
        for j in job_ids:
            pipe.hmget(names.job_key(j), [jobs.WORKER, jobs.STATUS])
            pipe.xlen(names.job_events(j))
        got = await pipe.execute()
    out = {}
    for i, j in enumerate(job_ids):
        worker, status = (v.decode() if isinstance(v, bytes) else "" for v in got[2 * i])
        out[j] = Holding(worker, status, int(got[2 * i + 1]))
    return out


async def all_running(r: aioredis.Redis, job_ids: list[str], workers: tuple[str, ...]) -> bool:
    """Every job started and still running, and every worker has written events of them."""
    held = (await holdings(r, job_ids)).values()
    started = all(h.status == "running" and h.events >= 2 for h in held)
    return started and {h.worker for h in held} == set(workers)


async def busy_on(r: aioredis.Redis, job_ids: list[str], worker: str, min_events: int = 3) -> list[str]:
    """Jobs running on ``worker`` with at least a start and two token events written."""
    return [
        j
        for j, h in (await holdings(r, job_ids)).items()
        if h.worker == worker and h.status == "running" and h.events >= min_events
    ]
