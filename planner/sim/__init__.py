"""A simulated serving environment for planner policies, built from measured cost curves."""

from planner.sim.curves import CURVES, RANDOM_INIT, SMOLLM2, CostCurves
from planner.sim.runner import Runner, Trace
from planner.sim.scenario import Phase, Scenario
from planner.sim.worker import SimWorker

__all__ = [
    "CURVES", "RANDOM_INIT", "SMOLLM2", "CostCurves", "Phase", "Runner", "Scenario", "SimWorker", "Trace",
]  # fmt: skip
