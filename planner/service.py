"""The planner service: telemetry in, versioned decisions out, policy swappable live.

One anyio task group runs three loops over one policy object (all on the event loop, so the
policy needs no locks): telemetry read through the planner's consumer group and fed to
``policy.observe``; a timer asking ``policy.decide(now)``; and the control stream, whose
PolicyCommands swap the policy. A decision is published when it differs from the last one,
or when the last one is getting old (so workers never see it go stale while the planner
lives); every swap, and every failed swap, is recorded in a decision's note, and every
decision names the control entry whose command put its policy in place (``command_id``).
The workers' newest startup cost profile (planner/profiles.py) is looked at every
``profile_check_s`` (every ``PROFILE_WAIT_S`` while there is none yet) and handed to the
policy (``use_profile``) when it is new, and to every policy swapped in.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import anyio
import redis.asyncio as aioredis
from redis.exceptions import RedisError, ResponseError

from planner.capacity import SLO, CapacityPlanner
from planner.capacity_io import CapacityReader
from planner.metrics import PlannerMetrics
from planner.policies import registry
from planner.policy_slot import PolicyFactory, PolicySlot, registry_factory
from planner.profiles import newest_profile, same
from planner.publisher import DecisionPublisher
from planner.settings import PlannerSettings
from shared import codec, keys
from shared.connection import connect
from shared.control import Decision, PolicyCommand, Telemetry
from shared.loops import every, keep_running, retry_redis, wait_for_redis
from shared.profile import CostProfile
from shared.streams import ensure_group, entries, id_str

log = logging.getLogger(__name__)
STALL_S = 30.0  # health: a decide loop silent this long is stalled
PROFILE_WAIT_S = 0.25  # seconds between looks for a cost profile while the planner has none


class PlannerService:
    def __init__(
        self,
        settings: PlannerSettings,
        *,
        redis: aioredis.Redis | None = None,
        factory: PolicyFactory = registry_factory,
    ) -> None:
        self.settings = settings
        self.r = redis if redis is not None else connect(settings.redis_url)
        self.slot = PolicySlot(self.r, factory)
        self.publisher = DecisionPublisher(self.r, settings.valid_for_s)
        self.observed = 0  # telemetry messages fed to policies
        self.metrics = PlannerMetrics()
        self.publisher.on_publish = self.metrics.on_publish
        self._saved_at = time.monotonic()
        self._decided_at = time.monotonic()  # the decide loop's last run (health)
        self.profile: CostProfile | None = None  # the workers' newest startup cost profile
        slo = SLO(settings.ttft_target_s, settings.tpot_target_s, settings.target_utilization)
        self.capacity = CapacityPlanner(
            slo,
            window_s=settings.capacity_window_s,
            scale_down_window_s=settings.scale_down_window_s,
            min_workers=settings.min_workers,
            max_workers=settings.max_workers,
        )
        self.capacity_reader = CapacityReader(self.r, self.capacity, list(settings.plan_models))

    async def start(self) -> Decision:
        """Set up groups, load the policy in force, publish a first decision."""
        await ensure_group(self.r, keys.TELEMETRY_STREAM, keys.TELEMETRY_GROUP, start="$")
        await ensure_group(self.r, keys.PLANNER_CONTROL_STREAM, keys.PLANNER_CONTROL_GROUP)
        default = PolicyCommand(
            policy=self.settings.policy, params=self.settings.params, requested_by="planner default"
        )
        if self.slot.factory is registry_factory:  # the gateway checks swaps against it
            await self.r.set(keys.PLANNER_POLICIES, registry.catalogue_json())
        await self.slot.load(default)
        log.info("planner running policy %s %s", self.slot.name, self.slot.command.params)
        await self.read_profile()
        return await self._publish(f"planner started with {self.slot.name}")

    async def run(self) -> None:
        """Serve until cancelled; waits for Redis at start and outlives its outages."""
        await wait_for_redis(self.r, "planner")
        await retry_redis("planner start", self.start, max_backoff_s=1.0)
        await retry_redis("planner status", self.write_status, max_backoff_s=1.0)  # seen at once, not in 1 s
        http = self.metrics.serve_http(self.settings.metrics_port, self.settings.metrics_host, self.health)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(every, 1.0, self.write_status, "status")
                tg.start_soon(keep_running, "cost profile", self._watch_profile)
                tg.start_soon(keep_running, "telemetry", self._gather_telemetry)
                tg.start_soon(keep_running, "control", self.read_control)
                tg.start_soon(every, self.settings.decide_s, self.decide, "decide")
                tg.start_soon(every, self.settings.capacity_s, self.plan_capacity, "capacity")
        finally:
            if http is not None:
                http.shutdown()
            with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                try:
                    await self.slot.save_state()
                except (RedisError, OSError) as exc:
                    log.warning("planner state not saved: %s", exc)

    async def _gather_telemetry(self) -> None:
        if await self.read_telemetry() < self.settings.batch:
            await anyio.sleep(self.settings.gather_s)  # let the next steps' telemetry gather

    async def read_telemetry(self, block_ms: int | None = -1) -> int:
        """Feed one batch of telemetry to the policy, then decide; returns the batch size."""
        try:
            resp = await self.r.xreadgroup(
                keys.TELEMETRY_GROUP,
                self.settings.consumer,
                {keys.TELEMETRY_STREAM: ">"},
                count=self.settings.batch,
                block=self.settings.block_ms if block_ms == -1 else block_ms,
            )
        except ResponseError as exc:  # a Redis that restarted empty lost the group
            if "NOGROUP" not in str(exc):
                raise
            await ensure_group(self.r, keys.TELEMETRY_STREAM, keys.TELEMETRY_GROUP, start="$")
            return 0
        got = entries(resp)
        for entry_id, fields in got:
            try:
                msg = codec.from_entry(fields)
            except codec.CodecError as exc:
                log.error("skipping malformed telemetry %s: %s", entry_id, exc)
                continue
            if isinstance(msg, Telemetry):
                try:
                    self.capacity.observe(msg)
                    self.slot.policy.observe(msg)
                    self.observed += 1
                    self.metrics.observe_telemetry(msg)
                except Exception:
                    log.exception("policy %s failed to observe telemetry", self.slot.name)
        if got:
            await self.r.xack(keys.TELEMETRY_STREAM, keys.TELEMETRY_GROUP, *(eid for eid, _ in got))
            await self.decide()
        return len(got)

    async def read_control(self, block_ms: int | None = -1) -> int:
        """Apply the next policy commands; returns how many were read."""
        try:
            resp = await self.r.xreadgroup(
                keys.PLANNER_CONTROL_GROUP,
                self.settings.consumer,
                {keys.PLANNER_CONTROL_STREAM: ">"},
                count=10,
                block=self.settings.block_ms if block_ms == -1 else block_ms,
            )
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            await ensure_group(self.r, keys.PLANNER_CONTROL_STREAM, keys.PLANNER_CONTROL_GROUP)
            return 0
        got = entries(resp)
        for entry_id, fields in got:
            try:
                cmd = codec.from_entry_as(fields, PolicyCommand)
            except codec.CodecError as exc:
                log.error("skipping malformed control entry %s: %s", entry_id, exc)
                await self._publish(f"error: malformed policy command: {exc}")
            else:
                await self.apply(cmd.model_copy(update={"id": id_str(entry_id)}))
            await self.r.xack(keys.PLANNER_CONTROL_STREAM, keys.PLANNER_CONTROL_GROUP, entry_id)
        return len(got)

    async def apply(self, cmd: PolicyCommand) -> Decision:
        """Swap to ``cmd``'s policy and publish at once; on failure keep the old one running."""
        old = self.slot.name
        try:
            await self.slot.swap(cmd)
        except Exception as exc:
            log.error("policy swap to %r %s failed: %s", cmd.policy, cmd.params, exc)
            return await self._publish(f"error: cannot use policy {cmd.policy!r}: {exc}; {old} keeps running")
        self._hand_profile()
        return await self._publish(f"policy {old} -> {cmd.policy} {cmd.params} by {cmd.requested_by}")

    def health(self, path: str) -> tuple[int, dict[str, Any]]:
        """The planner's probes (beside /metrics on ``--metrics-port``): 200 while its decide
        loop has run within ``STALL_S`` (and, but for /health/live, it has published)."""
        age = time.monotonic() - self._decided_at
        body = {
            "policy": self.slot.name,
            "version": self.publisher.last.version if self.publisher.last else 0,
        }
        ok = age <= STALL_S and (path == "/health/live" or self.publisher.last is not None)
        return (200 if ok else 503), {
            "status": "ok" if ok else "not_ready",
            "decide_age_s": round(age, 3),
            **body,
        }

    async def decide(self) -> Decision | None:
        """Ask the policy; publish when the choice changed or the last decision is aging."""
        self._decided_at = time.monotonic()
        now = time.time()
        last = self.publisher.last
        aging = last is None or now - last.created_at >= self.settings.republish_every_s
        published = None
        try:
            choice = self.slot.policy.decide(now)
        except Exception:
            log.exception("policy %s failed to decide", self.slot.name)
            choice = None
        moved = last is None or now - last.created_at >= self.settings.rule_publish_s
        if choice is not None and (
            aging
            or self.publisher.reshaped(choice, self.slot.name)
            or (moved and self.publisher.rule_moved(choice))
        ):
            name, cmd_id = self.slot.name, self.slot.command.id
            published = await self.publisher.publish(choice, name, choice.note, cmd_id)
        if time.monotonic() - self._saved_at >= self.settings.state_save_s:
            await self.slot.save_state()
            self._saved_at = time.monotonic()
        return published

    async def plan_capacity(self, now: float | None = None) -> dict[str, int]:
        """Estimate the workers each model needs (planner/capacity.py), export it, and publish
        a decision carrying it when it changed."""
        desired = await self.capacity_reader.refresh(now)
        self.metrics.observe_capacity(self.capacity)
        if desired != self.publisher.desired_workers:
            self.publisher.desired_workers = desired
            log.info("desired workers: %s", ", ".join(f"{m} {n}" for m, n in desired.items()) or "none")
            await self.decide()
        return desired

    async def _watch_profile(self) -> None:
        """One look at the profiles, after ``profile_check_s`` — or ``PROFILE_WAIT_S`` while
        none is known: a worker publishes its profile as it starts taking jobs, and until the
        policy has it, it decides without a prior (the first seconds of a run chose the prose
        drafter by acceptance alone, before its cost was known)."""
        await anyio.sleep(self.settings.profile_check_s if self.profile is not None else PROFILE_WAIT_S)
        await self.read_profile()

    async def read_profile(self) -> CostProfile | None:
        """Hand the policy the workers' newest cost profile when it is a new one."""
        profile = await newest_profile(self.r)
        if profile is not None and not same(profile, self.profile):
            self.profile = profile
            log.info(
                "cost profile of %s from worker %s (measured in %.1f s): the policy's prior",
                profile.model, profile.worker_id, profile.measure_s,
            )  # fmt: skip
            self._hand_profile()
        return self.profile

    def _hand_profile(self) -> None:
        if self.profile is None:
            return
        try:
            self.slot.policy.use_profile(self.profile)
        except Exception:
            log.exception("policy %s failed to take the cost profile", self.slot.name)

    async def write_status(self) -> None:
        """The planner's status key and drafter-weight gauges (planner/metrics.py)."""
        await self.metrics.write_status(self.r, self.slot.name, self.slot.policy)

    async def _publish(self, note: str) -> Decision:
        choice = self.slot.policy.decide(time.time())
        note = f"{note}: {choice.note}" if choice.note else note
        return await self.publisher.publish(choice, self.slot.name, note, self.slot.command.id)
