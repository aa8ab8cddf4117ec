"""Every policy against the same simulated worlds: regret at T and 4T, switches, throughput.

Run ``python -m planner.sim.compare [--steps T] [--seeds N]``. Deterministic for given
arguments (virtual clock; no wall-clock timing). Regret is the simulator's: seconds per token
per sequence above an oracle that runs the best γ for each batch size (catch-ups included
on both sides), summed over steps; it scores the γ choice for the drafter that actually ran.
No throughput column: the worlds' phases last a number of *steps*, so tokens per virtual
second would reward a policy for making the high-batch phases slow (it spends more of the
run's time where throughput is high). Throughput belongs to time-based load (benchmarks/).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from planner.policies import registry
from planner.sim.runner import Runner
from planner.sim.scenario import Scenario
from planner.sim.worker import SimWorker
from planner.sim.worlds import WORLDS

POLICIES: dict[str, tuple[str, dict[str, Any]]] = {
    "bandit": ("bandit", {}),
    "bandit, no C_switch": ("bandit", {"switch_cost": False}),
    "bandit, explore=paper": ("bandit", {"explore": "paper"}),
    "bandit, explore=fork": ("bandit", {"explore": "fork"}),
    "static γ=0": ("static", {"gamma": 0}),
    "static γ=3": ("static", {"gamma": 3}),
    "threshold γ=3 to batch 16": ("threshold", {}),
    "ucb": ("ucb", {}),
    "exp3": ("exp3", {}),
    "cost-model": ("cost-model", {"gamma_max": 4}),
    "hedge γ=3": ("hedge", {}),
}


@dataclass
class Row:
    """Means over seeds."""

    regret_t: float = 0.0
    regret_4t: float = 0.0
    switches: float = 0.0
    catch_up_s: float = 0.0


def evaluate(world: Callable[[], Scenario], name: str, params: dict[str, Any], steps: int, seeds: int) -> Row:
    row = Row()
    seeded = "seed" in registry.describe(name)["params"]
    for seed in range(seeds):
        policy = registry.create(name, **params, **({"seed": seed} if seeded else {}))
        trace = Runner(policy, SimWorker(world(), seed=seed)).run(4 * steps)
        row.regret_t += trace.cumulative_regret(steps) / seeds
        row.regret_4t += trace.cumulative_regret(4 * steps) / seeds
        row.switches += trace.switches_on / seeds
        row.catch_up_s += trace.switch_seconds / seeds
    return row


def table(world: Callable[[], Scenario], steps: int, seeds: int) -> Iterator[str]:
    """Markdown rows, one per policy, yielded as each is measured."""
    yield "| policy | R(T) s | R(4T) s | R(4T)/R(T) | 0→>0 switches | catch-up s |"
    yield "|---|---|---|---|---|---|"
    for label, (name, params) in POLICIES.items():
        r = evaluate(world, name, params, steps, seeds)
        ratio = f"{r.regret_4t / r.regret_t:.2f}" if r.regret_t > 1e-9 else "–"
        cells = [
            label,
            f"{r.regret_t:.3f}",
            f"{r.regret_4t:.3f}",
            ratio,
            f"{r.switches:.0f}",
            f"{r.catch_up_s:.1f}",
        ]
        yield "| " + " | ".join(cells) + " |"


def main() -> None:
    ap = argparse.ArgumentParser(description="Compare planner policies in the simulator.")
    ap.add_argument("--steps", type=int, default=2000, help="T; each run lasts 4T steps")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--world", choices=sorted(WORLDS), action="append", help="default: all")
    args = ap.parse_args()
    for name in args.world or list(WORLDS):
        print(f"\n### {name}: T = {args.steps} steps, mean of {args.seeds} seeds\n")
        for line in table(WORLDS[name], args.steps, args.seeds):
            print(line, flush=True)


if __name__ == "__main__":
    main()
