"""Elastic memory: the model drafters' weights and KV pools give way to the target's KV pool.

One budget holds the target's weights, the resident drafters (weights + their KV pools) and
the target's KV blocks. ``update(want_offload)`` runs at the start of every step, before
anything is scheduled, so every cache is consistent (drafts of the last step were rolled
back there), and the engine runs γ = 0 whenever ``resident`` is False:

    resident ──offload──▶ offloading ──weights on host──▶ offloaded ──reload──▶ reloading ──▶ resident

- offload: drop every drafter's per-sequence state and KV pool, move the weights to host
  memory (``WeightMover``), and once they are off the device grow the target's pool by the
  freed bytes.
- reload: shrink the target's pool back first (live blocks in the released tail move down
  with ``copy_blocks``; a sequence is preempted only when they cannot all fit), then bring
  the weights back in the background; when they are in, the drafters get fresh KV pools and
  catch up on their next draft (the switching cost).

Each completed move is one ``memory_events`` entry: kind ("offload" / "reload"), seconds of
the weight move (start to completion), kv_seconds of the pool resize, bytes handed over, and
the target's blocks before and after (with moved blocks and preemptions).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from typing import Any

from worker.engine.spec.model_drafter import ModelDrafter
from worker.engine.spec.residency import WeightMover


class Residency(enum.Enum):
    RESIDENT = "resident"
    OFFLOADING = "offloading"
    OFFLOADED = "offloaded"
    RELOADING = "reloading"


class ElasticMemory:
    def __init__(
        self,
        drafters: list[ModelDrafter],
        block_bytes: int,
        num_blocks: Callable[[], int],
        resize: Callable[[int], dict[str, Any]],
        on_release: Callable[[], None],
    ) -> None:
        """``num_blocks`` and ``resize`` read and resize the target's KV pool (resize returns
        its event: moved blocks, preemptions); ``on_release`` drops the drafters' state."""
        self.drafters = drafters
        self.movers = [WeightMover(d.runner.model) for d in drafters]
        self.block_bytes = block_bytes
        self.num_blocks, self.resize, self.on_release = num_blocks, resize, on_release
        self.state = Residency.RESIDENT
        self.bytes = sum(d.weight_bytes + d.kv_bytes for d in drafters)  # what an offload frees
        self.extra_blocks = 0  # target blocks gained by the offload in force
        self._pending: dict[str, Any] = {}  # the event of the move under way

    @property
    def resident(self) -> bool:
        return self.state is Residency.RESIDENT

    def update(self, want_offload: bool) -> list[dict[str, Any]]:
        """Advance the state machine one step; returns the moves completed now."""
        events = []
        if self.state is Residency.OFFLOADING and all(m.done() for m in self.movers):
            events.append(self._finish_offload())
        elif self.state is Residency.RELOADING and all(m.done() for m in self.movers):
            events.append(self._finish_reload())
        if not self.drafters:
            return events
        if self.state is Residency.RESIDENT and want_offload:
            self._start_offload()
            if all(m.done() for m in self.movers):  # a CPU offload completes at once
                events.append(self._finish_offload())
        elif self.state is Residency.OFFLOADED and not want_offload:
            self._start_reload()
        return events

    def _start_offload(self) -> None:
        self.on_release()
        for d in self.drafters:
            d.release_kv()
        for m in self.movers:
            m.start(to_host=True)
        self.state = Residency.OFFLOADING

    def _finish_offload(self) -> dict[str, Any]:
        seconds = max(m.finish() for m in self.movers)
        before = self.num_blocks()
        self.extra_blocks = self.bytes // self.block_bytes
        t0 = time.perf_counter()
        grown = self.resize(before + self.extra_blocks)
        self.state = Residency.OFFLOADED
        return {
            "kind": "offload", "seconds": seconds, "kv_seconds": time.perf_counter() - t0,
            "bytes": self.bytes, "from_blocks": before, "to_blocks": grown["to_blocks"],
            "moved_blocks": 0, "preempted": 0,
        }  # fmt: skip

    def _start_reload(self) -> None:
        before = self.num_blocks()
        t0 = time.perf_counter()
        shrunk = self.resize(max(2, before - self.extra_blocks))
        self._pending = {
            "kind": "reload", "kv_seconds": time.perf_counter() - t0, "bytes": self.bytes,
            "from_blocks": before, "to_blocks": shrunk["to_blocks"],
            "moved_blocks": shrunk["moved_blocks"], "preempted": shrunk["preempted"],
        }  # fmt: skip
        self.extra_blocks = 0
        for m in self.movers:
            m.start(to_host=False)
        self.state = Residency.RELOADING

    def _finish_reload(self) -> dict[str, Any]:
        seconds = max(m.finish() for m in self.movers)
        for d in self.drafters:
            d.restore_kv()
        self.state = Residency.RESIDENT
        event, self._pending = {**self._pending, "seconds": seconds}, {}
        return event
