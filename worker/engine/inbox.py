"""The engine's inbox: what other threads ask of the stepping thread, as typed commands.

``add_request``, ``abort_request``, ``apply_plan`` and ``set_num_blocks`` only queue a
command; the step takes every queued command at its start, under the same lock, so the
scheduler, block managers and caches are only ever touched by the stepping thread.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from worker.engine.api import EngineRequest
from worker.engine.spec.speculation_plan import SpeculationPlan


@dataclass(frozen=True)
class AddRequest:
    """Admit ``request``; one the engine cannot take (an empty prompt, an id in use, a
    constraint the grammar engine refuses) finishes at once instead."""

    request: EngineRequest


@dataclass(frozen=True)
class Abort:
    """Finish the request as cancelled, waiting or running; an id the engine lacks is ignored."""

    request_id: str


@dataclass(frozen=True)
class ApplyPlan:
    """Speculate by ``plan`` from this step on."""

    plan: SpeculationPlan


@dataclass(frozen=True)
class Resize:
    """Resize the KV pool to ``num_blocks``, preempting sequences whose blocks cannot stay."""

    num_blocks: int


Command = AddRequest | Abort | ApplyPlan | Resize


class Inbox:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._commands: deque[Command] = deque()

    def put(self, command: Command) -> None:
        with self._lock:
            self._commands.append(command)

    @contextmanager
    def take(self) -> Iterator[list[Command]]:
        """Every queued command, in order; the lock is held until the block ends, so the
        caller can move requests into its own state with no moment where they are in neither."""
        with self._lock:
            commands = list(self._commands)
            self._commands.clear()
            yield commands

    def pending_or(self, busy: Callable[[], bool]) -> bool:
        """True if a command is queued or ``busy()`` (called under the lock)."""
        with self._lock:
            return bool(self._commands) or busy()
