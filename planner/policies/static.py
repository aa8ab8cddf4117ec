"""``static``: the same γ for every batch size; the fixed baseline and the safe default."""

from __future__ import annotations

from typing import ClassVar

from planner.policies.base import Choice, Policy
from shared.control import ALL_BATCHES, Telemetry
from shared.policy_params import Param, bool_param, int_param, str_param


class StaticPolicy(Policy):
    """Fixed γ for every batch size (γ = 0 turns speculation off), optional drafter and offload.

    Offloading the draft model makes speculation impossible, so with ``offload`` the
    published γ is 0 whatever ``gamma`` says.
    """

    PARAMS: ClassVar[dict[str, Param]] = {
        "gamma": int_param(0, "draft tokens per step for every batch size (0 = no speculation)", 0, 64),
        "drafter": str_param(None, "drafter to use (None: the worker's default)"),
        "offload": bool_param(False, "offload the draft model to free KV-cache memory (forces γ = 0)"),
    }

    def __init__(self, gamma: int = 0, drafter: str | None = None, offload: bool = False) -> None:
        super().__init__(gamma=gamma, drafter=drafter, offload=offload)
        self.gamma = gamma
        self.drafter = drafter
        self.offload = offload

    def observe(self, t: Telemetry) -> None:
        """Nothing to learn."""

    def decide(self, now: float) -> Choice:
        gamma = 0 if self.offload else self.gamma
        return Choice(
            gamma_table=[(ALL_BATCHES, gamma)],
            drafter=self.drafter,
            offload=self.offload,
            note=f"static γ={gamma}" + (" offload" if self.offload else ""),
        )
