"""``nightjar bench``: replay a workload through the real gateway under a changing arrival rate,
once per planner configuration, and report throughput, latency, acceptance and the γ timeline."""
