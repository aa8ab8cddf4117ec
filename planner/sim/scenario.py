"""What the simulated worker faces: load phases, drafter acceptance per domain, memory, noise."""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.sim.curves import RANDOM_INIT, CostCurves


@dataclass(frozen=True)
class Phase:
    """``steps`` steps during which ``demand`` requests want to decode (a fixed number or a
    uniform range lo..hi drawn each step), in text domain ``domain``."""

    steps: int
    demand: int | tuple[int, int]
    domain: str = "default"

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError("a phase lasts at least one step")


@dataclass
class Scenario:
    """Everything that defines a simulated serving environment (all times from ``curves``)."""

    phases: list[Phase]
    # drafter -> domain -> i.i.d. per-token acceptance α; the first drafter is the worker default
    acceptance: dict[str, dict[str, float]] = field(default_factory=lambda: {"draft": {"default": 0.7}})
    curves: CostCurves = RANDOM_INIT
    noise: float = 0.05  # σ of the mean-one log-normal factor on every measured time
    cycle: bool = True  # after the last phase, start again from the first
    kv_blocks: int = 2048  # KV pool with the draft resident
    draft_blocks: int = 256  # extra KV blocks once the draft is offloaded
    blocks_per_seq: int = 16
    offload_steps: int = 2  # steps an offload takes before the pool grows
    reload_steps: int = 8  # steps a reload takes before the draft can run again
    switch_scale: float = 0.5  # catch-up of L tokens costs switch_scale · L · draft step (unmeasured)
    max_context: int = 256  # a catch-up never exceeds the context the sequences hold
    idle_step_s: float = 0.01  # virtual time of a heartbeat
    gamma_cap: int = 16  # the largest γ the worker will run
    _latency: dict[tuple[int, int, str, str], float] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.phases:
            raise ValueError("a scenario needs at least one phase")
        if not self.acceptance:
            raise ValueError("a scenario needs at least one drafter")
        for drafter, by_domain in self.acceptance.items():
            for domain, alpha in by_domain.items():
                if not 0.0 <= alpha < 1.0:
                    raise ValueError(f"acceptance {drafter!r}/{domain!r} must be in [0, 1), got {alpha}")

    @property
    def default_drafter(self) -> str:
        return next(iter(self.acceptance))

    def alpha(self, drafter: str, domain: str) -> float:
        by_domain = self.acceptance.get(drafter) or self.acceptance[self.default_drafter]
        return by_domain.get(domain, by_domain.get("default", 0.0))

    def phase_at(self, step: int) -> Phase:
        total = sum(p.steps for p in self.phases)
        if self.cycle:
            step %= total
        for phase in self.phases:
            if step < phase.steps:
                return phase
            step -= phase.steps
        return self.phases[-1]

    def catch_up(self, batch: int, tokens: int, drafter: str | None = None) -> float:
        """Expected seconds of a catch-up over ``tokens`` per sequence: the profile's measured
        catch-up where it has one, else ``switch_scale`` · tokens · one draft step."""
        measured = self.curves.catch_up(batch, tokens)
        if measured is not None:
            return measured
        return self.switch_scale * tokens * self.curves.draft(batch, drafter)

    def expected_tokens(self, alpha: float, gamma: int) -> float:
        """Expected tokens per sequence per step: (1 − α^(γ+1)) / (1 − α)."""
        return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)

    def expected_latency(self, batch: int, gamma: int, drafter: str, domain: str) -> float:
        """Expected seconds per token per sequence (catch-up excluded): the bandit's ℓ."""
        key = (batch, gamma, drafter, domain)
        if key not in self._latency:
            alpha = self.alpha(drafter, domain)
            step = self.curves.step(batch, gamma, drafter)
            self._latency[key] = step / self.expected_tokens(alpha, gamma)
        return self._latency[key]

    def optimal_gamma(self, batch: int, gamma_max: int, drafter: str, domain: str) -> int:
        return min(range(gamma_max + 1), key=lambda g: self.expected_latency(batch, g, drafter, domain))
