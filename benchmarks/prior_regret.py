"""``nightjar`` with and without the cost profile as its prior, in the simulator's worlds.

Each world's own cost profile (its curves as a ``CostProfile``) is handed to the policy, as
the planner hands over a worker's startup profile; regret and exploration bins are compared
side by side (virtual clock: the numbers do not depend on the machine's load).

    python -m benchmarks.prior_regret --steps 2000 --seeds 3
"""

from __future__ import annotations

import argparse

from planner.policies import registry
from planner.sim import Runner, SimWorker
from planner.sim.worlds import WORLDS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2000, help="T: each run lasts 4T steps")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--worlds", default="four-batches,smollm2-mixed,small-gain")
    args = ap.parse_args()
    print("| world | R(T) s without / with | R(4T) s without / with | exploration bins without / with |")
    print("|---|---|---|---|")
    for name in args.worlds.split(","):
        rows = []
        for prior in (False, True):
            r_t = r_4t = 0.0
            bins = 0
            for seed in range(args.seeds):
                world = WORLDS[name]()
                pol = registry.create("bandit", seed=seed, offload=False, drafter_policy="fixed")
                if prior:
                    pol.use_profile(world.curves.to_profile())
                trace = Runner(pol, SimWorker(world, seed=seed)).run(4 * args.steps)
                r_t += trace.cumulative_regret(args.steps) / args.seeds
                r_4t += trace.cumulative_regret(4 * args.steps) / args.seeds
                bins += sum(getattr(b, "explore_bins", 0) for b in getattr(pol, "bandits", []))
            rows.append((r_t, r_4t, bins))
        (a, b, c), (x, y, z) = rows
        print(f"| {name} | {a:.3f} / {x:.3f} | {b:.3f} / {y:.3f} | {c} / {z} |")


if __name__ == "__main__":
    main()
