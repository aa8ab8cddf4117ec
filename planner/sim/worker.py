"""A simulated worker: applies Choices like the real one and reports Telemetry like it.

Each ``step(choice)`` runs one decoding step on a virtual clock: the batch is the phase's
demand capped by how many sequences the KV pool holds; γ comes from the choice's gamma_table
for that batch size (0 while the draft is offloaded or reloading); per sequence, the number
of accepted draft tokens is a truncated geometric draw with the drafter's α in the current
domain; times come from the cost curves times log-normal noise; turning speculation back on
first pays a draft catch-up for the tokens skipped while it was off. Heartbeats (batch 0)
are sent while nothing is running.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from planner.policies.base import Choice
from planner.sim.scenario import Scenario
from shared.control import SwitchCostEvent, Telemetry


def gamma_for(table: list[tuple[int, int]], batch_size: int) -> int:
    """The worker's lookup (same rule as shared.control.Decision.gamma_for)."""
    for upper, gamma in table:
        if batch_size <= upper:
            return gamma
    return table[-1][1] if table else 0


class SimWorker:
    """One worker in a Scenario; deterministic for a given seed and sequence of choices."""

    def __init__(self, scenario: Scenario, seed: int = 0, worker_id: str = "sim-0") -> None:
        self.sc = scenario
        self.rng = np.random.default_rng(seed)
        self.worker_id = worker_id
        self.step_index = 0
        self.clock = 0.0
        self.resident = True
        self.transition: tuple[str, int] | None = None  # ("offload" | "reload", steps left)
        self.skipped = 0  # tokens per sequence the drafters have not seen (steps since γ > 0)
        self.context = 0.0

    @property
    def domain(self) -> str:
        return self.sc.phase_at(self.step_index).domain

    def demand(self) -> int:
        d = self.sc.phase_at(self.step_index).demand
        return int(self.rng.integers(d[0], d[1] + 1)) if isinstance(d, tuple) else d

    def pool(self) -> int:
        return self.sc.kv_blocks + (0 if self.resident else self.sc.draft_blocks)

    def _noise(self) -> float:
        s = self.sc.noise
        return math.exp(s * float(self.rng.standard_normal()) - 0.5 * s * s) if s > 0 else 1.0

    def _advance_memory(self, want_offload: bool) -> None:
        if self.transition is not None:
            kind, left = self.transition
            self.transition = (kind, left - 1) if left > 1 else None
            if self.transition is None:
                self.resident = kind == "reload"
        elif want_offload and self.resident:
            self.transition = ("offload", self.sc.offload_steps)
        elif not want_offload and not self.resident:
            self.transition = ("reload", self.sc.reload_steps)

    def step(self, choice: Choice) -> Telemetry:
        self._advance_memory(choice.offload)
        can_draft = self.resident and self.transition is None and not choice.offload
        demand = self.demand()
        batch = min(demand, self.pool() // self.sc.blocks_per_seq)
        common: dict[str, Any] = {
            "worker_id": self.worker_id, "step": self.step_index, "running": batch,
            "waiting": demand - batch, "queue_depth": demand - batch, "total_blocks": self.pool(),
            "free_blocks": self.pool() - batch * self.sc.blocks_per_seq, "draft_resident": can_draft,
        }  # fmt: skip
        self.step_index += 1
        if batch == 0:
            self.clock += self.sc.idle_step_s
            return Telemetry(ts=self.clock, **common)
        drafter = choice.drafter if choice.drafter in self.sc.acceptance else self.sc.default_drafter
        gamma = min(gamma_for(choice.gamma_table, batch), self.sc.gamma_cap) if can_draft else 0
        curves, alpha = self.sc.curves, self.sc.alpha(drafter, self.domain)
        switch: list[SwitchCostEvent] = []
        catch_up = 0.0
        if gamma > 0 and self.skipped > 0:
            tokens = min(self.skipped, self.sc.max_context)
            catch_up = self.sc.catch_up(batch, tokens, drafter) * self._noise()
            switch.append(SwitchCostEvent(drafter=drafter, batch_size=batch, tokens=tokens, seconds=catch_up))
        self.skipped = 0 if gamma > 0 else self.skipped + 1
        accepted = 0
        if gamma > 0:
            runs = self.rng.geometric(1.0 - alpha, size=batch) - 1 if alpha > 0 else np.zeros(batch, int)
            accepted = int(np.minimum(runs, gamma).sum())
        draft_time = gamma * curves.draft(batch, drafter) * self._noise()
        verify_time = curves.target(batch, gamma + 1) * self._noise()
        step_time = draft_time + verify_time + catch_up
        counterfactual = {}
        if gamma > 0:
            n = batch * gamma
            for name in self.sc.acceptance:
                counterfactual[name] = float(self.rng.binomial(n, self.sc.alpha(name, self.domain))) / n
        self.clock += step_time
        self.context = min(self.context + 1 + accepted / batch, self.sc.max_context)
        return Telemetry(
            ts=self.clock, batch_size=batch, num_tokens=batch + accepted, gamma=gamma,
            drafter=drafter if gamma > 0 else None, step_time=step_time, draft_time=draft_time,
            verify_time=verify_time, other_time=catch_up, proposed=batch * gamma, accepted=accepted,
            counterfactual=counterfactual, mean_context=self.context, switch_costs=switch, **common,
        )  # fmt: skip
