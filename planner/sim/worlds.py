"""Named simulated worlds used by the tests and by ``python -m planner.sim.compare``."""

from __future__ import annotations

from collections.abc import Callable

from planner.sim.curves import SMOLLM2
from planner.sim.scenario import Phase, Scenario


def four_batches(alpha: float = 0.7) -> Scenario:
    """Load cycling through batch sizes 1, 4, 16, 64 (one pow2 bucket each), 50 steps apiece;
    random-init curves, where the best γ falls from 4 at batch 1 to 1 at batch 64."""
    phases = [Phase(50, 1), Phase(50, 4), Phase(50, 16), Phase(50, 64)]
    return Scenario(phases=phases, acceptance={"d": {"default": alpha}})


def smollm2_mixed() -> Scenario:
    """SmolLM2 costs at α = 0.8: speculation pays at batch 1 and 8 (γ = 4, 3), not at 32."""
    phases = [Phase(50, 1), Phase(50, 8), Phase(50, 32)]
    return Scenario(phases=phases, acceptance={"d": {"default": 0.8}}, curves=SMOLLM2)


def small_gain(alpha: float = 0.55, dwell: int = 30) -> Scenario:
    """Load alternating between batch 16 (γ = 1 gains ~4 %) and 64 (γ = 0 is best): each
    return to batch 16 would pay a catch-up larger than what speculating there gains."""
    return Scenario(phases=[Phase(dwell, 16), Phase(dwell, 64)], acceptance={"d": {"default": alpha}})


def drafter_shift(steps: int = 600) -> Scenario:
    """Five drafters at batch 4; the best changes from d2 (code) to d3 (chat) after ``steps``."""
    code = {"d0": 0.5, "d1": 0.6, "d2": 0.8, "d3": 0.55, "d4": 0.4}
    chat = {"d0": 0.6, "d1": 0.5, "d2": 0.45, "d3": 0.75, "d4": 0.4}
    acceptance = {d: {"code": code[d], "chat": chat[d]} for d in code}
    phases = [Phase(steps, 4, "code"), Phase(steps, 4, "chat")]
    return Scenario(phases=phases, acceptance=acceptance, cycle=False)


def busy_and_quiet() -> Scenario:
    """Quiet low-batch phases around an overload that fills the KV pool (128 sequences with
    the draft resident, 160 without), two drafters whose ranking flips with the domain."""
    phases = [Phase(300, (1, 4), "code"), Phase(400, (140, 160), "chat"), Phase(300, (2, 8), "chat")]
    acceptance = {"d0": {"code": 0.8, "chat": 0.5}, "d1": {"code": 0.5, "chat": 0.75}}
    return Scenario(phases=phases, acceptance=acceptance, kv_blocks=2048, draft_blocks=512)


WORLDS: dict[str, Callable[[], Scenario]] = {
    "four-batches": four_batches,
    "smollm2-mixed": smollm2_mixed,
    "small-gain": small_gain,
    "busy-and-quiet": busy_and_quiet,
}
