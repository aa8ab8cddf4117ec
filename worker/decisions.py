"""Following the planner: apply each newer decision live, fall back when it goes stale.

The worker reads ``DECISION_LATEST`` at start, then follows ``DECISIONS_STREAM``. A decision
is applied live as the engine's ``SpeculationPlan`` (worker/speculation.py ``apply_decision``;
no restart) and its version recorded in ``DECISION_ACKS``. When the one in force outlives its
``valid_for_s`` (the planner is gone or stuck), a safe built-in rule takes over — no
speculation, draft resident — until a fresh decision arrives.
"""

from __future__ import annotations

import logging

import anyio
import redis.asyncio as aioredis

from shared import codec, keys
from shared.control import ALL_BATCHES, Decision
from shared.loops import every, keep_running
from shared.streams import entries, id_str, last_id
from worker.engine.api import Engine
from worker.speculation import apply_decision

log = logging.getLogger(__name__)

FALLBACK_POLICY = "fallback"


def fallback_decision(note: str) -> Decision:
    """γ = 0 for every batch size, draft kept resident. Version 0: not the planner's."""
    return Decision(
        version=0,
        policy=FALLBACK_POLICY,
        gamma_table=[(ALL_BATCHES, 0)],
        drafter=None,
        offload=False,
        valid_for_s=float("inf"),
        note=note,
    )


def describe_gammas(table: list[tuple[int, int]]) -> str:
    """A γ table as "≤4:2 ≤16:1 rest:0" (one bucket: just the γ)."""
    if len(table) == 1:
        return str(table[0][1])
    return " ".join(f"{'rest' if b >= ALL_BATCHES else f'≤{b}'}:{g}" for b, g in table)


def _what(d: Decision) -> tuple[list[tuple[int, int]], str | None, bool]:
    return (d.gamma_table, d.drafter, d.offload)


class DecisionFollower:
    def __init__(
        self, r: aioredis.Redis, engine: Engine, worker_id: str, check_s: float, block_ms: int
    ) -> None:
        self.r = r
        self.engine = engine
        self.worker_id = worker_id
        self.check_s = check_s
        self.block_ms = block_ms
        self.current: Decision | None = None  # the planner decision in force (None in fallback)
        self.newest_version = 0  # newest planner version seen, applied or not
        self._cursor = "0-0"

    @property
    def fallback(self) -> bool:
        return self.current is None

    @property
    def version(self) -> int:
        return self.current.version if self.current else 0

    async def start(self) -> None:
        """Apply the latest decision (or the fallback) before the first job runs."""
        self._cursor = await last_id(self.r, keys.DECISIONS_STREAM)
        raw = await self.r.get(keys.DECISION_LATEST)
        decision = None
        if isinstance(raw, bytes):
            try:
                decision = codec.decode_as(raw, Decision)
            except codec.CodecError as exc:
                log.error("unreadable latest decision: %s", exc)
        if decision is None or not await self.offer(decision):
            await self._fall_back("no fresh planner decision at start")

    async def offer(self, d: Decision, now: float | None = None) -> bool:
        """Apply ``d`` if it is newer than anything seen and still fresh."""
        if d.version <= self.newest_version:
            return False
        self.newest_version = d.version
        if d.is_stale(now):
            return False
        before = self.current
        apply_decision(self.engine, d)
        self.current = d
        await self.r.hset(keys.DECISION_ACKS, self.worker_id, d.version)
        what = (d.gamma_table, d.drafter, d.offload)
        level = logging.DEBUG if before is not None and what == _what(before) else logging.INFO
        log.log(
            level,
            "applied decision v%d (%s): γ %s, drafter %s, offload %s",
            d.version,
            d.policy,
            describe_gammas(d.gamma_table),
            d.drafter or "default",
            "yes" if d.offload else "no",
        )
        return True

    async def check(self, now: float | None = None) -> None:
        """Switch to the fallback rule if the decision in force went stale."""
        if self.current is not None and self.current.is_stale(now):
            await self._fall_back(f"decision v{self.current.version} is stale")

    async def _fall_back(self, why: str) -> None:
        apply_decision(self.engine, fallback_decision(why))
        self.current = None
        await self.r.hset(keys.DECISION_ACKS, self.worker_id, 0)
        log.warning("planner fallback: %s", why)

    async def run(self) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(keep_running, "decisions", self._follow)
            tg.start_soon(every, self.check_s, self.check, "decision staleness")

    async def _follow(self) -> None:
        resp = await self.r.xread({keys.DECISIONS_STREAM: self._cursor}, count=100, block=self.block_ms)
        for entry_id, fields in entries(resp):
            self._cursor = id_str(entry_id)
            try:
                msg = codec.from_entry(fields)
            except codec.CodecError as exc:
                log.error("skipping a malformed decision %s: %s", self._cursor, exc)
                continue
            if isinstance(msg, Decision):
                await self.offer(msg)
