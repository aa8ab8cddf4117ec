"""What the planner service can be told."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class PlannerSettings:
    redis_url: str = "memory://"
    policy: str = "static"  # used when no policy was chosen before (keys.PLANNER_ACTIVE)
    params: dict[str, Any] = field(default_factory=dict)
    consumer: str = "planner"
    decide_s: float = 0.5  # how often the policy is asked, besides after telemetry batches
    valid_for_s: float = 30.0  # lifetime of a published decision
    republish_s: float = 10.0  # an unchanged decision is re-published this often to stay valid
    state_save_s: float = 5.0  # how often the policy's learned state is persisted
    block_ms: int = 1000
    batch: int = 500  # telemetry entries read at once
    # After a batch that was not full, telemetry is left to gather this long before the next
    # read: one read (and ack, and decision) per ~gather_s instead of one per engine step. At
    # batch 1 a step is ~5 ms, so reading each alone cost the planner ~0.4 ms of CPU per step
    # (on the worker's own core under `nightjar up`); decisions still follow within gather_s.
    gather_s: float = 0.05
    profile_check_s: float = 5.0  # how often the workers' cost profiles are looked at
    metrics_port: int | None = None  # serve Prometheus /metrics here (0: any free port)
    metrics_host: str = "127.0.0.1"
    # The capacity estimate (planner/capacity.py): workers each model needs under this SLO.
    ttft_target_s: float = 2.0
    tpot_target_s: float = 0.1
    target_utilization: float = 0.8
    capacity_s: float = 1.0  # how often it is estimated
    capacity_window_s: float = 30.0  # the arrival and output rates' averaging window
    scale_down_window_s: float = 60.0  # down only to the highest count of this window
    min_workers: int = 1
    max_workers: int = 0  # 0: no cap
    plan_models: list[str] = field(default_factory=list)  # planned for even with no live worker

    def __post_init__(self) -> None:
        if self.republish_s >= self.valid_for_s:
            raise ValueError("republish_s must be below valid_for_s, or workers fall back between publishes")
        if (
            self.min_workers < 0
            or self.max_workers < 0
            or (self.max_workers and self.max_workers < self.min_workers)
        ):
            raise ValueError(
                "min_workers and max_workers must be ≥ 0, and max_workers (when set) ≥ min_workers"
            )
