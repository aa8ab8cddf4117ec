"""Simulated environments and run helpers shared by the planner policy tests."""

from __future__ import annotations

from typing import Any

from planner.policies import registry
from planner.policies.base import Policy
from planner.sim import SMOLLM2, Phase, Runner, Scenario, SimWorker, Trace

DRAFTERS = {"d0": 0.5, "d1": 0.6, "d2": 0.8, "d3": 0.55, "d4": 0.4}


def four_batches(alpha: float = 0.7) -> Scenario:
    """Load cycling through batch sizes 1, 4, 16, 64 (one pow2 bucket each), 50 steps apiece."""
    phases = [Phase(50, 1), Phase(50, 4), Phase(50, 16), Phase(50, 64)]
    return Scenario(phases=phases, acceptance={"d": {"default": alpha}})


def mixed_smollm2() -> Scenario:
    """SmolLM2 costs at α = 0.8: speculation pays at batch 1 and 8, not at 32."""
    phases = [Phase(50, 1), Phase(50, 8), Phase(50, 32)]
    return Scenario(phases=phases, acceptance={"d": {"default": 0.8}}, curves=SMOLLM2)


def small_gain(alpha: float = 0.55, dwell: int = 30) -> Scenario:
    """Load alternating between batch 16 (γ = 1 gains ~4 %) and 64 (γ = 0 is best)."""
    return Scenario(phases=[Phase(dwell, 16), Phase(dwell, 64)], acceptance={"d": {"default": alpha}})


def drafter_shift(steps: int = 600) -> Scenario:
    """Five drafters; the best one changes from d2 (code) to d3 (chat) midway."""
    code = {"d0": 0.5, "d1": 0.6, "d2": 0.8, "d3": 0.55, "d4": 0.4}
    chat = {"d0": 0.6, "d1": 0.5, "d2": 0.45, "d3": 0.75, "d4": 0.4}
    acceptance = {d: {"code": code[d], "chat": chat[d]} for d in code}
    return Scenario(
        phases=[Phase(steps, 4, "code"), Phase(steps, 4, "chat")], acceptance=acceptance, cycle=False
    )


def busy_and_quiet() -> Scenario:
    """Quiet low-batch phases and overload phases that fill the KV pool (draft offload pays)."""
    phases = [Phase(300, (1, 4), "code"), Phase(400, (140, 160), "chat"), Phase(300, (2, 8), "chat")]
    acceptance = {"d0": {"code": 0.8, "chat": 0.5}, "d1": {"code": 0.5, "chat": 0.75}}
    return Scenario(phases=phases, acceptance=acceptance, kv_blocks=2048, draft_blocks=512)


def run(
    policy: Policy | str, scenario: Scenario, steps: int, seed: int = 0, delay: int = 3, **params: Any
) -> tuple[Policy, Trace]:
    pol = registry.create(policy, **params) if isinstance(policy, str) else policy
    return pol, Runner(pol, SimWorker(scenario, seed=seed), delay=delay).run(steps)
