"""The baseline policies Nightjar is compared with in the simulator and the benchmarks:
``threshold`` (vLLM's disable-by-batch-size), ``ucb`` and ``exp3`` (the context-free
bandits, with their step rewards) and ``cost-model`` (RAKV-ASD, with its measured costs).

They implement ``planner.policies.base.Policy`` and are listed under their names in
``planner.policies.registry``, so the planner runs them by name like any other policy."""
