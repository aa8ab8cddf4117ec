"""The planner's Prometheus metrics and its status key for ``nightjar top``.

Metrics: decisions published (by policy), the active policy, the published γ per batch
bucket, drafter and offload, the drafter weights of a Hedge-style policy, decision version
and age, telemetry observed, and steps the workers ran on the fallback rule.

The status key (``keys.PLANNER_STATUS``, JSON, refreshed every second with a short TTL)
carries what only the planner knows and the decision does not — the drafter weights — so a
terminal view can show them from Redis alone.
"""

from __future__ import annotations

import json
import time
from typing import Any

import redis.asyncio as aioredis

from planner.capacity import CapacityPlanner
from shared import keys
from shared.control import Decision, Telemetry
from shared.metrics import MetricSet, bucket_label

STATUS_TTL_S = 30


def drafter_weights(policy: Any) -> dict[str, float]:
    """The drafter weights of a policy that learns them (``chooser.learner``), else {}."""
    chooser = getattr(policy, "chooser", None)
    learner = getattr(chooser, "learner", None)
    if learner is None:
        return {}
    try:
        return {str(k): float(v) for k, v in learner.weights().items()}
    except Exception:  # a policy's own state must not break its metrics
        return {}


class PlannerMetrics(MetricSet):
    def __init__(self) -> None:
        super().__init__()
        g, c = self.gauge, self.counter
        self.published = c("planner_decisions_published", "Decisions published, by policy.", ["policy"])
        self.active = g(
            "planner_active_policy", "1 for the policy running now, 0 for earlier ones.", ["policy"]
        )
        self.gamma = g("planner_gamma", "Published γ per batch bucket (largest batch size).", ["bucket"])
        self.drafter = g("planner_drafter", "1 for the published drafter, 0 for the others.", ["drafter"])
        self.offload = g("planner_offload", "1 while the published decision offloads the drafters.")
        self.weights = g("planner_drafter_weight", "Drafter weights of the policy's learner.", ["drafter"])
        self.acceptance = g(
            "planner_drafter_acceptance", "The cost rule prior acceptance per drafter.", ["drafter"]
        )
        self.version = g("planner_decision_version", "Version of the last decision published.")
        self.age = g("planner_decision_age_seconds", "Seconds since the last decision was published.")
        self.observed = c("planner_telemetry_observed", "Telemetry messages fed to the policy.", ["worker"])
        self.fallback = c(
            "planner_fallback_steps",
            "Telemetry steps a worker ran on its fallback rule (no fresh decision).",
            ["worker"],
        )
        self.desired_workers = g(
            "planner_desired_workers",
            "Workers each model needs under the planner's SLO (planner/capacity.py; KEDA scales on it).",
            ["model"],
        )
        self.arrival = g("planner_arrival_rate", "Jobs arriving per second (averaged), by model.", ["model"])
        self.job_tokens = g(
            "planner_tokens_per_job", "Output tokens per job (averaged), by model.", ["model"]
        )
        self.worker_tokens = g(
            "planner_worker_tokens_per_second",
            "Tokens/s one worker yields at the largest batch within the TPOT target, by model.",
            ["model"],
        )
        self.last: Decision | None = None
        self._policy_obj: Any = None
        self.age.set_function(lambda: time.time() - self.last.created_at if self.last else 0.0)

    def observe_telemetry(self, t: Telemetry) -> None:
        self.observed.labels(worker=t.worker_id).inc()
        self.fallback.labels(worker=t.worker_id).inc(1 if t.fallback else 0)  # 0: exported from the start

    def observe_capacity(self, capacity: CapacityPlanner) -> None:
        """The capacity estimate's gauges, per model."""
        for model, c in capacity.models.items():
            if c.desired is not None:
                self.desired_workers.labels(model=model).set(c.desired)
            if c.load is not None:
                self.arrival.labels(model=model).set(c.load.arrival_per_s)
                self.job_tokens.labels(model=model).set(c.load.tokens_per_job)
            if c.need is not None:
                self.worker_tokens.labels(model=model).set(c.need.worker_tokens_per_s)

    def on_publish(self, d: Decision) -> None:
        """A decision was published."""
        previous, self.last = self.last, d
        self.published.labels(policy=d.policy).inc()
        if previous is not None and previous.policy != d.policy:
            self.active.labels(policy=previous.policy).set(0)
        self.active.labels(policy=d.policy).set(1)
        old = {bucket_label(b) for b, _ in previous.gamma_table} if previous else set()
        new = {bucket_label(b): g for b, g in d.gamma_table}
        for gone in old - set(new):
            self.gamma.remove(gone)
        for label, gamma in new.items():
            self.gamma.labels(bucket=label).set(gamma)
        if previous is not None and previous.drafter is not None and previous.drafter != d.drafter:
            self.drafter.labels(drafter=previous.drafter).set(0)
        if d.drafter is not None:
            self.drafter.labels(drafter=d.drafter).set(1)
        self.offload.set(1 if d.offload else 0)
        self.version.set(d.version)
        for name, alpha in d.acceptance.items():
            self.acceptance.labels(drafter=name).set(alpha)

    def observe_policy(self, policy: Any) -> dict[str, float]:
        """Refresh the drafter weights from the running policy; returns them."""
        weights = drafter_weights(policy)
        for name, w in weights.items():
            self.weights.labels(drafter=name).set(w)
        return weights

    async def write_status(self, r: aioredis.Redis, policy_name: str, policy: Any) -> None:
        """The planner's status for observers (``nightjar top``)."""
        status = {
            "policy": policy_name,
            "weights": self.observe_policy(policy),
            "ts": time.time(),
            "version": self.last.version if self.last else 0,
        }
        await r.set(keys.PLANNER_STATUS, json.dumps(status), ex=STATUS_TTL_S)
