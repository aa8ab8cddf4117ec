"""``nightjar top``: a live terminal view of a running deployment, from Redis alone.

It reads what the services already keep in Redis — the worker registry (``nj:workers``), the
tail of the telemetry stream, the latest decision and the acks, the planner's running
policy and status (drafter weights), the job group's pending and lag — and redraws every
``--interval`` seconds; ``--once`` prints one snapshot and exits. Nothing here talks to a
service, so it works the same against ``nightjar up``'s embedded store (which ``up`` serves
on 127.0.0.1 and announces: top finds it when told no Redis, ``nightjar/store_server.py``)
and against any Redis a deployment uses.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import anyio
import redis.asyncio as aioredis
from pydantic import Field

from nightjar.flags import add, build, given
from nightjar.options import STANDALONE_REDIS, UsageError
from shared import codec, keys
from shared.control import Decision, PolicyCommand, Telemetry, WorkerInfo
from shared.settings import EnvSettings
from shared.streams import group_load

CLEAR = "\x1b[H\x1b[2J"


@dataclass
class WorkerView:
    info: WorkerInfo
    acked: int | None = None
    last: Telemetry | None = None  # the newest telemetry (step or idle heartbeat)
    last_work: Telemetry | None = None  # the newest step that did work
    steps: list[Telemetry] = field(default_factory=list)  # working steps in the tail, oldest first

    def gamma_run(self, lo: int, hi: int, version: int | None = None) -> float | None:
        """Mean γ run by the tail's steps whose batch size is in [lo, hi] (under decision
        ``version`` only, when given)."""
        got = [
            t.gamma
            for t in self.steps
            if lo <= t.batch_size <= hi and (version is None or t.decision_version == version)
        ]
        return sum(got) / len(got) if got else None

    def drafter_shares(self) -> dict[str, float]:
        drafted = Counter(
            t.drafter if t.drafter is not None and t.proposed else "no draft" for t in self.steps
        )
        n = len(self.steps)
        return {d: c / n for d, c in drafted.most_common()} if n else {}

    def acceptance(self) -> float | None:
        proposed = sum(t.proposed for t in self.steps)
        return sum(t.accepted for t in self.steps) / proposed if proposed else None

    def tokens_per_s(self) -> float | None:
        if len(self.steps) < 2:
            return None
        span = self.steps[-1].ts - self.steps[0].ts
        return sum(t.num_tokens for t in self.steps[1:]) / span if span > 0 else None


@dataclass
class Snapshot:
    at: float
    workers: list[WorkerView]
    decision: Decision | None
    active: PolicyCommand | None
    status: dict[str, Any]
    pending: int
    lag: int
    tail: int


def _decode(raw: Any, cls: type[Any]) -> Any:
    if not isinstance(raw, bytes | str):
        return None
    try:
        return codec.decode_as(raw if isinstance(raw, bytes) else raw.encode(), cls)
    except codec.CodecError:
        return None


async def snapshot(r: aioredis.Redis, tail: int = 500) -> Snapshot:
    """Everything the view shows, read from Redis in a few round trips."""
    async with r.pipeline(transaction=False) as pipe:
        pipe.hgetall(keys.WORKERS)
        pipe.hgetall(keys.DECISION_ACKS)
        pipe.get(keys.DECISION_LATEST)
        pipe.get(keys.PLANNER_ACTIVE)
        pipe.get(keys.PLANNER_STATUS)
        pipe.xrevrange(keys.TELEMETRY_STREAM, count=tail)
        workers_raw, acks_raw, latest, active, status_raw, entries = await pipe.execute()
    acks = {_text(k): int(v) for k, v in acks_raw.items()}
    views: dict[str, WorkerView] = {}
    for raw in workers_raw.values():
        info = _decode(raw, WorkerInfo)
        if info is not None:
            views[info.worker_id] = WorkerView(info, acks.get(info.worker_id))
    pending = lag = 0
    for stream in _job_streams({v.info.model for v in views.values()}):
        p, g = await group_load(r, stream, keys.JOBS_GROUP)
        pending, lag = pending + p, lag + g
    per_worker: dict[str, list[Telemetry]] = defaultdict(list)
    for _, fields in reversed(entries):
        try:
            t = codec.from_entry(fields)
        except codec.CodecError:
            continue
        if isinstance(t, Telemetry):
            per_worker[t.worker_id].append(t)
    for wid, ts in per_worker.items():
        view = views.get(wid)
        if view is None:
            continue  # telemetry of a worker gone from the registry
        view.last = ts[-1]
        view.steps = [t for t in ts if t.batch_size or t.num_tokens or t.prefill_tokens]
        view.last_work = view.steps[-1] if view.steps else None
    try:
        status = json.loads(status_raw) if status_raw else {}
    except ValueError:
        status = {}
    return Snapshot(
        at=time.time(),
        workers=sorted(views.values(), key=lambda v: v.info.worker_id),
        decision=_decode(latest, Decision),
        active=_decode(active, PolicyCommand),
        status=status if isinstance(status, dict) else {},
        pending=pending,
        lag=lag,
        tail=tail,
    )


def _job_streams(models: set[str]) -> list[str]:
    """The job streams to count: one per served model where jobs are queued per model
    (``keys.jobs_stream``), else the one shared stream."""
    per_model = getattr(keys, "jobs_stream", None)
    if per_model is not None:
        return [str(per_model(m)) for m in sorted(models)]
    return [str(getattr(keys, "JOBS_STREAM"))]  # noqa: B009 - gone once queues are per model


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _buckets(d: Decision | None) -> list[tuple[int, int, int]]:
    """(lo, hi, γ) of each bucket of the decision's γ table."""
    if d is None:
        return []
    out, lo = [], 1
    for upper, gamma in d.gamma_table:
        out.append((lo, upper, gamma))
        lo = upper + 1
    return out


def _bucket_name(lo: int, hi: int) -> str:
    return f"≥{lo}" if hi >= 1 << 30 else (f"{lo}" if lo == hi else f"{lo}-{hi}")


def _fmt(x: float | None, spec: str = ".2f", none: str = "-") -> str:
    return none if x is None else format(x, spec)


def render(s: Snapshot, url: str = "") -> str:
    """The snapshot as text (no colours: it reads the same in a log or a test)."""
    d = s.decision
    lines = [f"nightjar top  {url}  {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(s.at))}"]
    policy = s.active.policy if s.active else s.status.get("policy", "-")
    params = s.active.params if s.active and s.active.params else ""
    if d is None:
        lines.append(f"planner   policy {policy} {params}  no decision published")
    else:
        table = "  ".join(f"{_bucket_name(lo, hi)}:γ{g}" for lo, hi, g in _buckets(d))
        lines.append(
            f"planner   policy {policy} {params}  decision v{d.version} ({d.policy}) "
            f"age {s.at - d.created_at:.1f}s{'  STALE' if d.is_stale(s.at) else ''}"
        )
        lines.append(
            f"decided   γ by batch {table}  drafter {d.drafter or 'default'}  "
            f"offload {'yes' if d.offload else 'no'}"
        )
    weights = s.status.get("weights") or {}
    if weights:
        ws = "  ".join(f"{k} {float(v):.2f}" for k, v in sorted(weights.items(), key=lambda kv: -kv[1]))
        lines.append(f"hedge     drafter weights  {ws}")
    lines.append(f"queue     waiting {s.lag}  in workers {s.pending}  workers {len(s.workers)}")
    lines.append("")
    head = (
        f"{'WORKER':<18} {'MODEL':<16} {'JOBS':>7} {'RUN':>4} {'WAIT':>4} {'KV%':>6} {'γ':>3} "
        f"{'DRAFTER':<16} {'DRAFT':<9} {'DECISION':<12} {'TOK/S':>7} {'ACCEPT':>6}"
    )
    lines.append(head)
    for w in s.workers:
        t, work = w.last, w.last_work
        kv = 100.0 * (1 - work.free_blocks / work.total_blocks) if work and work.total_blocks else None
        version = w.acked if w.acked is not None else w.info.decision_version
        decision = "fallback" if w.info.fallback or version == 0 else f"v{version}"
        if d is not None and version and version < d.version:
            decision += " (old)"
        state = "draining" if w.info.draining else ""
        resident = "-" if work is None else ("resident" if work.draft_resident else "offloaded")
        lines.append(
            f"{w.info.worker_id[:18]:<18} {w.info.model[:16]:<16} {f'{w.info.running}/{w.info.max_jobs}':>7} "
            f"{t.running if t else 0:>4} {t.waiting if t else 0:>4} {_fmt(kv, '.1f'):>6} "
            f"{work.gamma if work else 0:>3} {(work.drafter or '-') if work else '-':<16} {resident:<9} "
            f"{decision:<12} {_fmt(w.tokens_per_s(), '.0f'):>7} {_fmt(w.acceptance()):>6} {state}".rstrip()
        )
    if s.workers:
        lines.append("")
        current = d.version if d else None
        lines.append(
            f"γ by batch bucket, decided / run (mean over the steps under v{current or '-'} "
            f"in the last {s.tail} telemetry entries)"
        )
        for w in s.workers:
            cells = [
                f"{_bucket_name(lo, hi)}: {g}/{_fmt(w.gamma_run(lo, hi, current), '.1f')}"
                for lo, hi, g in _buckets(d)
            ]
            lines.append(f"  {w.info.worker_id[:18]:<18} {'  '.join(cells) or '-'}")
        lines.append("drafter shares of working steps")
        for w in s.workers:
            shares = "  ".join(f"{k} {v:.0%}" for k, v in w.drafter_shares().items()) or "no working steps"
            lines.append(f"  {w.info.worker_id[:18]:<18} {shares}")
    return "\n".join(lines)


async def show(r: aioredis.Redis, url: str, once: bool, interval: float, tail: int) -> None:
    while True:
        text = render(await snapshot(r, tail), url)
        if once:
            print(text, flush=True)
            return
        sys.stdout.write(CLEAR + text + "\n")
        sys.stdout.flush()
        await anyio.sleep(interval)


class TopSettings(EnvSettings):
    redis_url: str | None = Field(
        default=None,
        description="the deployment's Redis; unset: the embedded store of a running `nightjar up` on this "
        f"machine (it announces itself), else {STANDALONE_REDIS}",
    )
    once: bool = Field(
        default=False, validation_alias="NIGHTJAR_TOP_ONCE", description="print one snapshot and exit"
    )
    interval: float = Field(
        default=1.0, gt=0, validation_alias="NIGHTJAR_TOP_INTERVAL", description="seconds between refreshes"
    )
    tail: int = Field(
        default=500,
        ge=1,
        validation_alias="NIGHTJAR_TOP_TAIL",
        description="telemetry entries the rates are taken over",
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nightjar top", description=__doc__.split("\n\n")[0])
    add(p, "--redis-url", TopSettings, "redis_url")
    add(p, "--once", TopSettings, "once", action="store_const", const=True)
    add(p, "--interval", TopSettings, "interval", type=float)
    add(p, "--tail", TopSettings, "tail", type=int)
    return p


def store_url(given: str | None) -> tuple[str, str]:
    """The Redis to watch and where it came from: ``--redis-url`` / NIGHTJAR_REDIS_URL, else
    the newest running ``nightjar up`` (``nightjar.store_server``), else the local default."""
    if given:
        return given, "given"
    from nightjar.store_server import announced

    ups = announced()
    if ups:
        return ups[0].redis_url, f"nightjar up, pid {ups[0].pid}"
    return STANDALONE_REDIS, "default"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = build(TopSettings, **given(args, TopSettings))
    except UsageError as exc:
        print(f"nightjar top: error: {exc}", file=sys.stderr)
        return 2
    url, source = store_url(settings.redis_url)
    if url.startswith("memory://"):
        print(
            "nightjar top: error: memory:// lives inside the `nightjar up` process; leave --redis-url out "
            "to find a running `nightjar up`, or give the Redis URL the services use",
            file=sys.stderr,
        )
        return 2
    from redis.exceptions import RedisError

    from shared.connection import connect

    async def go() -> None:
        r = connect(url)
        try:
            await show(r, url, settings.once, settings.interval, settings.tail)
        finally:
            await r.aclose()

    try:
        anyio.run(go)
    except KeyboardInterrupt:
        return 0
    except (RedisError, OSError) as exc:
        print(f"nightjar top: error: Redis at {url} ({source}): {exc}", file=sys.stderr)
        return 1
    return 0
