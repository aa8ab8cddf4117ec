"""What the planner service can be told: each field reads ``NIGHTJAR_<FIELD>`` (or the
variable its alias names; ``shared.settings``), and the ``nightjar planner`` / ``up`` flags
override it. The descriptions are the flags' help.

``DEFAULT_POLICY`` is the one default policy of every entry point (``nightjar up``,
``nightjar planner``, compose and an embedded ``PlannerService``)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from shared.settings import CommaList, EnvSettings

# Speculation on by default: the nightjar policy (docs/planner.md).
DEFAULT_POLICY = "nightjar"


class PlannerSettings(EnvSettings):
    redis_url: str = Field(
        default="memory://", description="the job store (redis://host:port/db, memory://, ...)"
    )
    policy: str = Field(
        default=DEFAULT_POLICY,
        description="the policy run when none was chosen before (a restarted planner resumes the one "
        "chosen last, keys.PLANNER_ACTIVE)",
    )
    params: dict[str, Any] = Field(default_factory=dict, description="the policy's parameters")
    consumer: str = Field(
        default="planner", description="this planner's consumer name in the telemetry group"
    )
    decide_s: float = Field(
        default=0.5, gt=0, description="how often the policy is asked, besides after telemetry"
    )
    valid_for_s: float = Field(
        default=30.0,
        gt=0,
        validation_alias="NIGHTJAR_DECISION_VALID_FOR_S",
        description="seconds a decision stays valid: workers fall back to no speculation when the planner "
        "is silent this long",
    )
    republish_s: float | None = Field(
        default=None,
        gt=0,
        description="an unchanged decision is re-published this often; unset: min(10, valid_for/3)",
    )
    rule_publish_s: float = Field(
        default=1.0,
        ge=0,
        description="a decision whose only news is the cost rule's numbers (step costs, acceptance) is "
        "published at most this often; any other change at once",
    )
    state_save_s: float = Field(
        default=5.0, gt=0, description="how often the policy's learned state is persisted"
    )
    block_ms: int = Field(default=1000, ge=1, description="milliseconds of one blocking telemetry read")
    batch: int = Field(default=500, ge=1, description="telemetry entries read at once")
    # After a batch that was not full, telemetry is left to gather this long before the next
    # read: one read (and ack, and decision) per ~gather_s instead of one per engine step. At
    # batch 1 a step is ~5 ms, so reading each alone cost the planner ~0.4 ms of CPU per step
    # (on the worker's own core under `nightjar up`); decisions still follow within gather_s.
    gather_s: float = Field(default=0.05, ge=0, description="seconds telemetry gathers between reads")
    profile_check_s: float = Field(
        default=5.0, gt=0, description="how often the workers' cost profiles are looked at"
    )
    metrics_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="serve Prometheus /metrics on this port (0: any free one); unset: none",
    )
    metrics_host: str = Field(default="127.0.0.1", description="address /metrics binds")
    # The capacity estimate (planner/capacity.py): workers each model needs under this SLO.
    ttft_target_s: float = Field(
        default=2.0, gt=0, description="SLO: seconds within which a waiting job starts"
    )
    tpot_target_s: float = Field(default=0.1, gt=0, description="SLO: seconds per output token of one stream")
    target_utilization: float = Field(
        default=0.8, gt=0, le=1, description="the busiest a worker is planned to be, in (0, 1]"
    )
    capacity_s: float = Field(default=1.0, gt=0, description="how often the capacity estimate is made")
    capacity_window_s: float = Field(
        default=30.0, gt=0, description="the averaging window of the arrival and output rates"
    )
    scale_down_window_s: float = Field(
        default=60.0, ge=0, description="the desired count falls only to the highest of this window"
    )
    min_workers: int = Field(default=1, ge=0, description="the fewest workers asked for a model")
    max_workers: int = Field(default=0, ge=0, description="the most workers asked for a model (0: no cap)")
    plan_models: CommaList = Field(
        default=(),
        description="models to plan for even with no live worker, e.g. scaled to zero (comma-separated)",
    )

    @model_validator(mode="after")
    def _republish_below_validity(self) -> PlannerSettings:
        if self.republish_every_s >= self.valid_for_s:
            raise ValueError("republish_s must be below valid_for_s, or workers fall back between publishes")
        if self.max_workers and self.max_workers < self.min_workers:
            raise ValueError("max_workers (when set) must be at least min_workers")
        return self

    @property
    def republish_every_s(self) -> float:
        """``republish_s``, or min(10 s, a third of ``valid_for_s``) when unset."""
        return self.republish_s if self.republish_s is not None else min(10.0, self.valid_for_s / 3)
