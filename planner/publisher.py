"""Versioned decisions: INCR a counter, SET the latest, XADD to the decision stream."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import redis.asyncio as aioredis

from planner.policies.base import Choice
from shared import codec, keys
from shared.control import Decision, StepCosts

DECISIONS_MAXLEN = 10_000  # the stream is a history for observers; workers need only the tail


class DecisionPublisher:
    def __init__(self, r: aioredis.Redis, valid_for_s: float) -> None:
        self.r = r
        self.valid_for_s = valid_for_s
        self.last: Decision | None = None
        self.on_publish: Callable[[Decision], None] | None = None  # e.g. the planner's metrics
        self.desired_workers: dict[str, int] = {}  # the capacity estimate, carried by every decision
        # One publish at a time (the periodic one and an admin's command may meet): else a
        # later version's latest could be overwritten by an earlier one's.
        self._lock = anyio.Lock()

    def rule_moved(self, choice: Choice) -> bool:
        """Only the cost rule's numbers moved (step costs by > 3 %, an acceptance by > 0.03):
        news, but not urgent — served step costs jitter that much step to step at one user,
        and published on every move they made 14 decisions a second on nj-target (the service
        publishes such a move at most every ``rule_publish_s``)."""
        return self.last is None or _rule_moved(self.last, choice)

    def reshaped(self, choice: Choice, policy: str) -> bool:
        """Anything but the cost rule's numbers changed: what runs, where, or how it is held."""
        d = self.last
        return d is None or (
            d.policy != policy
            or [tuple(x) for x in d.gamma_table] != [tuple(x) for x in choice.gamma_table]
            or d.drafter != choice.drafter
            or d.drafter_scope != choice.drafter_scope
            or d.score_drafters != choice.score_drafters
            or _costs_moved(d.drafter_costs, choice.drafter_costs)
            or sorted(d.skip_drafters) != sorted(choice.skip_drafters)
            or d.offload != choice.offload
            or d.hold_steps != choice.hold_steps
            or d.hold_by_drafter != choice.hold_by_drafter
            or d.hold_tokens != choice.hold_tokens
            or bool(d.step_costs) != bool(choice.step_costs)
            or d.desired_workers != self.desired_workers
        )

    async def publish(self, choice: Choice, policy: str, note: str, command_id: str = "") -> Decision:
        """Publish ``choice`` as the next version; ``command_id``: the control entry that put
        ``policy`` in place (``Decision.command_id``). Publishes never interleave: versions
        are published (latest, then stream) in the order they were taken."""
        async with self._lock:
            return await self._publish(choice, policy, note, command_id)

    async def _publish(self, choice: Choice, policy: str, note: str, command_id: str) -> Decision:
        version = int(await self.r.incr(keys.DECISION_VERSION))
        decision = Decision(
            version=version,
            policy=policy,
            gamma_table=[(int(b), int(g)) for b, g in choice.gamma_table],
            drafter=choice.drafter,
            drafter_scope="request" if choice.drafter_scope == "request" else "batch",
            score_drafters=choice.score_drafters,
            drafter_costs={k: round(float(v), 4) for k, v in choice.drafter_costs.items()},
            skip_drafters=sorted(choice.skip_drafters),
            offload=choice.offload,
            step_costs=[_rounded(c) for c in choice.step_costs],
            acceptance={k: round(float(v), 4) for k, v in choice.acceptance.items()},
            acceptance_hi={k: round(float(v), 4) for k, v in choice.acceptance_hi.items()},
            hold_steps=choice.hold_steps,
            hold_by_drafter=dict(choice.hold_by_drafter),
            hold_tokens=choice.hold_tokens,
            desired_workers=dict(self.desired_workers),
            valid_for_s=self.valid_for_s,
            note=note,
            command_id=command_id,
        )
        # The latest first, then the stream, one after the other: on Redis Cluster the two
        # keys are in different slots (no transaction spans them). A worker that starts in
        # between reads the new latest and then skips the same version on the stream; a
        # planner that dies in between leaves the stream one decision short until the next
        # publish (``republish_s``), never a latest older than the stream's newest.
        await self.r.set(keys.DECISION_LATEST, codec.encode(decision))
        await self.r.xadd(
            keys.DECISIONS_STREAM, codec.entry(decision), maxlen=DECISIONS_MAXLEN, approximate=True
        )
        self.last = decision
        if self.on_publish is not None:
            self.on_publish(decision)
        return decision


def _costs_moved(old: dict[str, float], new: dict[str, float], tol: float = 0.1) -> bool:
    """Drafter costs worth a new decision: another set of drafters, or one moved by > 10 %."""
    if set(old) != set(new):
        return True
    return any(abs(new[k] - old[k]) > tol * max(old[k], 1e-3) for k in new)


def _rounded(c: StepCosts) -> StepCosts:
    return StepCosts(
        batch=c.batch,
        plain_s=round(c.plain_s, 6),
        spec_s={d: [round(x, 6) for x in xs] for d, xs in c.spec_s.items()},
    )


def _rule_moved(d: Decision, choice: Choice, tol: float = 0.03) -> bool:
    """The cost rule worth a new decision: step costs or an acceptance moved by > 3 %
    (relative; acceptance by 0.03 absolute), or a rule appeared or went."""
    if len(d.step_costs) != len(choice.step_costs) or set(d.acceptance) != set(choice.acceptance):
        return True
    for old, new in zip(d.step_costs, choice.step_costs, strict=True):
        if old.batch != new.batch or set(old.spec_s) != set(new.spec_s):
            return True
        pairs = [(old.plain_s, new.plain_s)]
        pairs += [(a, b) for k in new.spec_s for a, b in zip(old.spec_s[k], new.spec_s[k], strict=False)]
        if any(abs(b - a) > tol * max(a, 1e-6) for a, b in pairs):
            return True
    moved = [abs(choice.acceptance[k] - d.acceptance[k]) for k in choice.acceptance]
    moved += [
        abs(choice.acceptance_hi.get(k, 0.0) - d.acceptance_hi.get(k, 0.0)) for k in choice.acceptance_hi
    ]
    return any(m > tol for m in moved)
