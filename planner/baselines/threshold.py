"""``threshold``: speculate at a fixed γ up to a batch size, not above it (vLLM's
disable-by-batch-size rule)."""

from __future__ import annotations

from typing import Any, ClassVar

from planner.policies.base import Choice, Policy
from shared.control import ALL_BATCHES, Telemetry
from shared.policy_params import Param, int_param, str_param


class ThresholdPolicy(Policy):
    """γ = ``gamma`` for batch sizes ≤ ``max_batch``, γ = 0 above: speculation pays at small
    batches (memory-bound) and costs at large ones (compute-bound). Learns nothing."""

    PARAMS: ClassVar[dict[str, Param]] = {
        "gamma": int_param(3, "γ at batch sizes up to max_batch", 1, 16),
        "max_batch": int_param(16, "largest batch size that still speculates", 1),
        "drafter": str_param(None, "drafter to use (None: the worker's default)"),
    }

    def __init__(self, **params: Any) -> None:
        p = {k: spec.default for k, spec in self.PARAMS.items()} | params
        super().__init__(**p)
        self.gamma: int = p["gamma"]
        self.max_batch: int = p["max_batch"]
        self.drafter: str | None = p["drafter"]

    def observe(self, t: Telemetry) -> None:
        """Nothing to learn."""

    def decide(self, now: float) -> Choice:
        return Choice(
            gamma_table=[(self.max_batch, self.gamma), (ALL_BATCHES, 0)],
            drafter=self.drafter,
            note=f"threshold γ={self.gamma} up to batch {self.max_batch}",
        )
