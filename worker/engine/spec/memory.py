"""Elastic memory: the model drafters' weights and KV pools give way to the target's KV pool.

One budget holds the target's weights, the resident drafters (weights + their KV pools) and
the target's KV blocks. At the start of every step, before anything is scheduled (so every
cache is consistent: drafts of the last step were rolled back there), the engine asks
``plan(want_offload, num_blocks)`` for a ``MemoryPlan``, applies it (drops the drafters'
per-sequence state, resizes its own KV pool) and hands the resize's outcome to ``record``,
which returns the moves completed now. ElasticMemory never touches the target's pool itself.
The engine runs γ = 0 whenever ``resident`` is False:

    resident ──offload──▶ offloading ──weights on host──▶ offloaded ──reload──▶ reloading ──▶ resident

- offload: drop every drafter's per-sequence state and KV pool, move the weights to host
  memory (``WeightMover``), and once they are off the device grow the target's pool by the
  freed bytes.
- reload: shrink the target's pool back first (live blocks in the released tail move down
  with ``copy_blocks``; a sequence is preempted only when they cannot all fit), then bring
  the weights back in the background; when they are in, the drafters get fresh KV pools and
  catch up on their next draft (the switching cost).

Each completed move is one ``MemoryEvent`` (shared/schemas.py): kind ("offload" / "reload"),
seconds of the weight move (start to completion), kv_seconds of the pool resize, bytes
handed over, and the target's blocks before and after (with moved blocks and preemptions).
At most one resize per step: an offload that completes while the decision already asks for
the drafters back starts the reload at the next step.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from shared.control import MemoryEvent
from worker.engine.spec.model_drafter import ModelDrafter
from worker.engine.spec.residency import WeightMover


class Residency(enum.Enum):
    RESIDENT = "resident"
    OFFLOADING = "offloading"
    OFFLOADED = "offloaded"
    RELOADING = "reloading"


@dataclass(frozen=True)
class MemoryPlan:
    """What the engine does for elastic memory at the start of a step, in this order."""

    release_drafters: bool = False  # drop every drafter's per-sequence state (an offload starts)
    resize_to: int | None = None  # then resize the target's KV pool to this many blocks
    finished: MemoryEvent | None = None  # a move that completed without a resize (a reload)


class ElasticMemory:
    def __init__(self, drafters: list[ModelDrafter], block_bytes: int) -> None:
        self.drafters = drafters
        self.movers = [WeightMover(d.runner.model) for d in drafters]
        self.block_bytes = block_bytes
        self.state = Residency.RESIDENT
        self.bytes = sum(d.weight_bytes + d.kv_bytes for d in drafters)  # what an offload frees
        self.extra_blocks = 0  # target blocks gained by the offload in force
        self._reload: MemoryEvent | None = None  # the pool shrink of the reload under way
        self._seconds = 0.0  # the weight move that completed in this plan

    @property
    def resident(self) -> bool:
        return self.state is Residency.RESIDENT

    def plan(self, want_offload: bool, num_blocks: int) -> MemoryPlan:
        """Advance the state machine one step (``num_blocks``: the target's pool now)."""
        if self.state is Residency.OFFLOADING and self._moved():
            return self._grow(num_blocks)
        finished = None
        if self.state is Residency.RELOADING and self._moved():
            for d in self.drafters:
                d.restore_kv()
            self.state = Residency.RESIDENT
            assert self._reload is not None
            finished, self._reload = self._reload.model_copy(update={"seconds": self._seconds}), None
        if not self.drafters:
            return MemoryPlan(finished=finished)
        if self.state is Residency.RESIDENT and want_offload:
            for d in self.drafters:
                d.release_kv()
            for m in self.movers:
                m.start(to_host=True)
            self.state = Residency.OFFLOADING
            if self._moved():  # a CPU offload completes at once
                return MemoryPlan(True, self._grow(num_blocks).resize_to, finished)
            return MemoryPlan(release_drafters=True, finished=finished)
        if self.state is Residency.OFFLOADED and not want_offload:
            self.state = Residency.RELOADING
            return MemoryPlan(resize_to=max(2, num_blocks - self.extra_blocks), finished=finished)
        return MemoryPlan(finished=finished)

    def record(self, plan: MemoryPlan, resized: MemoryEvent | None) -> list[MemoryEvent]:
        """The moves completed by ``plan``, given its resize's outcome (a ``kv_resize``
        event); starts the reload's weight copy once the pool has shrunk."""
        events = [plan.finished] if plan.finished else []
        if resized is None:
            return events
        move = resized.model_copy(update={"kv_seconds": resized.seconds, "bytes": self.bytes})
        if self.state is Residency.OFFLOADED:
            events.append(move.model_copy(update={"kind": "offload", "seconds": self._seconds}))
        elif self.state is Residency.RELOADING:
            self.extra_blocks = 0
            self._reload = move.model_copy(update={"kind": "reload"})
            for m in self.movers:
                m.start(to_host=False)
        return events

    def _moved(self) -> bool:
        """Whether every weight move under way is done (and, if so, swap the copies in)."""
        if not all(m.done() for m in self.movers):
            return False
        self._seconds = max((m.finish() for m in self.movers if m.moving), default=0.0)
        return True

    def _grow(self, num_blocks: int) -> MemoryPlan:
        self.extra_blocks = self.bytes // self.block_bytes
        self.state = Residency.OFFLOADED
        return MemoryPlan(resize_to=num_blocks + self.extra_blocks)
