"""The running policy: built from a PolicyCommand, swapped live, its state kept in Redis.

The command in force is stored in ``keys.PLANNER_ACTIVE`` so a restarted planner runs the
policy last chosen; each policy's learned state lives in ``keys.PLANNER_STATE`` under its
name (msgpack), saved periodically and on a swap, and loaded when the policy is built.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import msgpack
import redis.asyncio as aioredis

from planner.policies.base import Policy
from shared import codec, keys
from shared.control import PolicyCommand

log = logging.getLogger(__name__)

PolicyFactory = Callable[..., Policy]


def registry_factory(name: str, **params: Any) -> Policy:
    from planner.policies import registry

    return registry.create(name, **params)


class PolicySlot:
    def __init__(self, r: aioredis.Redis, factory: PolicyFactory = registry_factory) -> None:
        self.r = r
        self.factory = factory
        self.policy: Policy
        self.command: PolicyCommand

    @property
    def name(self) -> str:
        return self.command.policy

    async def load(self, default: PolicyCommand) -> None:
        """Run the stored command's policy, or ``default`` when none is stored or it fails."""
        raw = await self.r.get(keys.PLANNER_ACTIVE)
        stored = None
        if isinstance(raw, bytes):
            try:
                stored = codec.decode_as(raw, PolicyCommand)
            except codec.CodecError as exc:
                log.error("ignoring an unreadable active policy: %s", exc)
        for cmd in (stored, default):
            if cmd is None:
                continue
            try:
                self.policy, self.command = await self._build(cmd), cmd
                return
            except Exception as exc:
                log.error("cannot run policy %r %s: %s", cmd.policy, cmd.params, exc)
        raise ValueError(f"the default policy {default.policy!r} cannot be built")

    async def swap(self, cmd: PolicyCommand) -> None:
        """Build ``cmd``'s policy and run it instead; raises (old policy untouched) on error."""
        policy = await self._build(cmd)
        await self.save_state()
        self.policy, self.command = policy, cmd
        await self.r.set(keys.PLANNER_ACTIVE, codec.encode(cmd))
        log.info("policy swapped to %s %s (by %s)", cmd.policy, cmd.params, cmd.requested_by)

    async def save_state(self) -> None:
        state = msgpack.packb(self.policy.state_dict(), use_bin_type=True)
        await self.r.hset(keys.PLANNER_STATE, self.name, state)

    async def _build(self, cmd: PolicyCommand) -> Policy:
        policy = self.factory(cmd.policy, **cmd.params)
        raw = await self.r.hget(keys.PLANNER_STATE, cmd.policy)
        if isinstance(raw, bytes):
            try:
                policy.load_state_dict(msgpack.unpackb(raw, raw=False, strict_map_key=False))
            except Exception as exc:  # state of another version or parameters: start afresh
                log.warning("not resuming %s from its saved state: %s", cmd.policy, exc)
                policy = self.factory(cmd.policy, **cmd.params)
        return policy
