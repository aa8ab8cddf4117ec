"""Runs a policy against a simulated worker with delayed feedback, and scores it.

Each step: every ``decide_every`` steps the policy publishes a Choice; the worker runs one
step under the latest Choice; its telemetry reaches the policy ``delay`` steps later, as
from a real worker whose messages cross a stream. Regret is measured against the scenario's
known optimum: the expected per-token latency of the γ that ran minus that of the best
γ ≤ ``gamma_max`` for the same batch size, drafter and domain (catch-up costs are counted
apart, in ``switch_seconds``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from planner.policies.base import Choice, Policy
from planner.sim.worker import SimWorker
from shared.control import ALL_BATCHES, Telemetry


@dataclass
class Trace:
    """Per-step record of a run."""

    batch: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    gamma: list[int] = field(default_factory=list)
    optimal: list[int] = field(default_factory=list)
    regret: list[float] = field(default_factory=list)  # seconds per token per sequence
    drafter: list[str | None] = field(default_factory=list)
    offload: list[bool] = field(default_factory=list)
    resident: list[bool] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    decisions: list[tuple[tuple[tuple[int, int], ...], str | None, bool]] = field(default_factory=list)
    switches_on: int = 0  # steps that went from γ = 0 to γ > 0
    switch_seconds: float = 0.0
    elapsed: float = 0.0  # virtual seconds

    def cumulative_regret(self, steps: int | None = None) -> float:
        return float(np.sum(self.regret[:steps]))

    def steps_with(self, batch: int) -> list[int]:
        return [i for i, b in enumerate(self.batch) if b == batch]


class Runner:
    """Drives ``policy`` against ``worker``; ``run`` may be called repeatedly (and the Runner
    deep-copied between calls, to continue one history two ways)."""

    def __init__(
        self, policy: Policy, worker: SimWorker, delay: int = 3, decide_every: int = 1, gamma_max: int = 4
    ) -> None:
        self.policy = policy
        self.worker = worker
        self.delay = delay
        self.decide_every = decide_every
        self.gamma_max = gamma_max
        self.in_flight: deque[Telemetry] = deque()
        self.choice = Choice(gamma_table=[(ALL_BATCHES, 0)])
        self.trace = Trace()
        self.steps = 0
        self.last_gamma = 0
        self.oracle_skipped = 0

    def run(self, steps: int) -> Trace:
        for _ in range(steps):
            if self.steps % self.decide_every == 0:
                self.choice = self.policy.decide(self.worker.clock)
                self.trace.decisions.append(
                    (tuple(self.choice.gamma_table), self.choice.drafter, self.choice.offload)
                )
            domain = self.worker.domain
            t = self.worker.step(self.choice)
            self._record(t, domain)
            self.in_flight.append(t)
            while len(self.in_flight) > self.delay:
                self.policy.observe(self.in_flight.popleft())
            self.steps += 1
        self.trace.elapsed = self.worker.clock
        return self.trace

    def _record(self, t: Telemetry, domain: str) -> None:
        tr, sc = self.trace, self.worker.sc
        tr.offload.append(self.choice.offload)
        tr.resident.append(t.draft_resident)
        tr.waiting.append(t.waiting)
        tr.batch.append(t.batch_size)
        tr.tokens.append(t.num_tokens)
        tr.gamma.append(t.gamma)
        tr.drafter.append(t.drafter)
        if t.batch_size == 0:
            tr.optimal.append(0)
            tr.regret.append(0.0)
            return
        drafter = t.drafter or self.choice.drafter or sc.default_drafter
        best = sc.optimal_gamma(t.batch_size, self.gamma_max, drafter, domain)
        tr.optimal.append(best)
        oracle_catch = 0.0
        if best > 0 and self.oracle_skipped > 0:
            tokens = min(self.oracle_skipped, sc.max_context)
            oracle_catch = sc.catch_up(t.batch_size, tokens, drafter)
        self.oracle_skipped = 0 if best > 0 else self.oracle_skipped + 1
        catch = sum(e.seconds for e in t.switch_costs)
        alpha = sc.alpha(drafter, domain)
        tr.regret.append(
            sc.expected_latency(t.batch_size, t.gamma, drafter, domain)
            + catch / sc.expected_tokens(alpha, t.gamma)
            - sc.expected_latency(t.batch_size, best, drafter, domain)
            - oracle_catch / sc.expected_tokens(alpha, best)
        )
        if t.gamma > 0 and self.last_gamma == 0:
            tr.switches_on += 1
        tr.switch_seconds += catch
        self.last_gamma = t.gamma
