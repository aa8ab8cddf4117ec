"""Every Redis stream, group and key name in one place.

All names share the ``nj:`` prefix so a deployment can share a Redis with other programs.
"""

from __future__ import annotations

PREFIX = "nj:"

# Job intake: the gateway XADDs, workers read through one consumer group.
JOBS_STREAM = PREFIX + "jobs"
JOBS_GROUP = "workers"
DEAD_LETTER_STREAM = PREFIX + "jobs:dead"
DEAD_LETTER_MAXLEN = 10_000  # MAXLEN ~: operators read the recent ones

# Cancellation is broadcast: every worker reads the whole stream from "$".
CANCEL_STREAM = PREFIX + "cancel"

# Telemetry: workers XADD (MAXLEN ~), the planner reads through its group.
TELEMETRY_STREAM = PREFIX + "telemetry"
TELEMETRY_GROUP = "planner"
TELEMETRY_MAXLEN = 20_000

# Planner decisions: a stream of every version, the latest under one key, acks per worker.
DECISIONS_STREAM = PREFIX + "decisions"
DECISION_LATEST = PREFIX + "decision:latest"
DECISION_ACKS = PREFIX + "decision:acks"  # hash worker_id -> applied version
DECISION_VERSION = PREFIX + "decision:version"  # INCR counter: the next decision's version
PLANNER_CONTROL_STREAM = PREFIX + "planner:control"  # policy swaps
PLANNER_CONTROL_MAXLEN = 1_000  # MAXLEN ~ on every XADD of a policy swap
PLANNER_CONTROL_GROUP = "planner"  # a group, so a swap sent while the planner is down still lands
PLANNER_STATE = PREFIX + "planner:state"  # hash policy name -> msgpack state
PLANNER_ACTIVE = PREFIX + "planner:active"  # the running policy command (msgpack)
PLANNER_STATUS = PREFIX + "planner:status"  # JSON: policy, drafter weights, ts (for `nightjar top`)

# Workers announce themselves (hash worker_id -> msgpack info, refreshed with the heartbeat).
WORKERS = PREFIX + "workers"

JOB_TTL_S = 24 * 3600  # job status, result and event stream live this long after the last write


def job_key(job_id: str) -> str:
    """Hash with the job's status, result and bookkeeping."""
    return f"{PREFIX}job:{job_id}"


def job_events(job_id: str) -> str:
    """Stream of the job's start / token / finish / error events."""
    return f"{PREFIX}job:{job_id}:events"


def job_cancel(job_id: str) -> str:
    """Set when a client cancels the job, so a worker that picks it up later skips it."""
    return f"{PREFIX}job:{job_id}:cancel"
