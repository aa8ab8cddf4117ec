"""What a running deployment is doing, read from Redis alone: the worker registry
(``nj:workers``), the tail of the telemetry stream, the latest decision and the acks, the
planner's running policy and status (drafter weights), the job group's pending and lag.

``snapshot`` reads it in a few round trips; ``render`` is the text ``nightjar top`` shows,
``as_json`` the same facts for the gateway's chat page (its planner tab, ``/ui/api/top``).
Nothing here talks to a service, so it works the same on ``nightjar up``'s embedded store
(in its process) and on any Redis a deployment uses.
"""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from shared import codec, keys
from shared.control import Decision, PolicyCommand, Telemetry, WorkerInfo
from shared.streams import group_load


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
    """The job streams to count: one per served model (``keys.jobs_stream``)."""
    return [keys.jobs_stream(m) for m in sorted(models)]


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
        if d.step_costs:  # the cost rule: γ per bucket above is at these priors
            acc = "  ".join(f"{k} {v:.2f}" for k, v in sorted(d.acceptance.items(), key=lambda kv: -kv[1]))
            lines.append(f"cost rule acceptance prior  {acc}  hold {d.hold_steps} steps")
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


def as_json(s: Snapshot) -> dict[str, Any]:
    """The snapshot's facts as JSON (what ``render`` shows, unformatted): the planner's policy
    and decision — γ per batch-size bucket, drafter, offload, age —, the drafter weights,
    the queue and, per worker, its last step, the γ run per bucket, drafter shares,
    acceptance and tokens/s; ``text`` is ``render``'s."""
    d = s.decision
    buckets = _buckets(d)
    decision = None
    if d is not None:
        decision = {
            "version": d.version,
            "policy": d.policy,
            "age_s": round(s.at - d.created_at, 3),
            "stale": d.is_stale(s.at),
            "drafter": d.drafter,
            "offload": d.offload,
            "buckets": [{"batch": _bucket_name(lo, hi), "lo": lo, "gamma": g} for lo, hi, g in buckets],
        }
    workers = []
    current = d.version if d else None
    for w in s.workers:
        work = w.last_work
        version = w.acked if w.acked is not None else w.info.decision_version
        workers.append(
            {
                "worker_id": w.info.worker_id,
                "model": w.info.model,
                "jobs": w.info.running,
                "max_jobs": w.info.max_jobs,
                "draining": w.info.draining,
                "running": w.last.running if w.last else 0,
                "waiting": w.last.waiting if w.last else 0,
                "kv_used": (1 - work.free_blocks / work.total_blocks) if work and work.total_blocks else None,
                "gamma": work.gamma if work else 0,
                "drafter": work.drafter if work else None,
                "draft_resident": work.draft_resident if work else None,
                "decision_version": version,
                "fallback": bool(w.info.fallback or version == 0),
                "tokens_per_s": w.tokens_per_s(),
                "acceptance": w.acceptance(),
                "gamma_run": [
                    {"batch": _bucket_name(lo, hi), "decided": g, "run": w.gamma_run(lo, hi, current)}
                    for lo, hi, g in buckets
                ],
                "drafter_shares": w.drafter_shares(),
            }
        )
    weights = s.status.get("weights") or {}
    return {
        "at": s.at,
        "policy": s.active.policy if s.active else s.status.get("policy"),
        "params": s.active.params if s.active else {},
        "decision": decision,
        "weights": {str(k): float(v) for k, v in weights.items()} if isinstance(weights, dict) else {},
        "queue": {"waiting": s.lag, "in_workers": s.pending},
        "tail": s.tail,
        "workers": workers,
        "text": render(s),
    }
