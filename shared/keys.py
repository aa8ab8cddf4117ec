"""Every Redis stream, group and key name in one place.

All names share the ``nj:`` prefix so a deployment can share a Redis with other programs.
Names of one model's queue and jobs carry the model's hash tag (Redis Cluster slots).
"""

from __future__ import annotations

import hashlib
import re

PREFIX = "nj:"

# Job intake is per model: the gateway XADDs a job to its model's stream, that model's
# workers read it through one consumer group. Everything one Lua script or transaction
# touches — a model's job stream, dead letters and cancel stream, a job's hash, events and
# cancel flag — carries the model's hash tag ``{tag}``, so on Redis Cluster it lives in one
# slot (docs/scaling.md).
JOBS_GROUP = "workers"
DEAD_LETTER_MAXLEN = 10_000  # MAXLEN ~: operators read the recent ones
_SAFE_TAG = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def model_tag(model: str) -> str:
    """The hash tag of a model's keys: its name when short and plain, else a digest (a tag
    must not hold braces, and a key stays readable)."""
    if _SAFE_TAG.match(model):
        return model
    return "m-" + hashlib.sha256(model.encode()).hexdigest()[:24]


def _q(model: str) -> str:
    return f"{PREFIX}{{{model_tag(model)}}}:"


def jobs_stream(model: str) -> str:
    """The model's job stream (group ``JOBS_GROUP``)."""
    return _q(model) + "jobs"


def batch_stream(model: str) -> str:
    """The model's batch band (/v1/batches): jobs waiting until the model's workers have
    nothing live to do; a worker moves them onto ``jobs_stream`` then (no group reads it)."""
    return _q(model) + "jobs:batch"


def batch_inflight(model: str) -> str:
    """Ids of the ``jobs_stream`` entries moved there from ``batch_stream``: the live
    admission does not count those that are still on the stream."""
    return _q(model) + "jobs:batch:inflight"


def dead_letter_stream(model: str) -> str:
    """The model's dead letters: malformed entries and jobs started too often."""
    return _q(model) + "jobs:dead"


def cancel_stream(model: str) -> str:
    """Cancellations broadcast to the model's workers (each reads it from its start time)."""
    return _q(model) + "cancel"


def job_key(model: str, job_id: str) -> str:
    """Hash with the job's status, result and bookkeeping."""
    return f"{_q(model)}job:{job_id}"


def job_events(model: str, job_id: str) -> str:
    """Stream of the job's start / token / finish / error events."""
    return f"{_q(model)}job:{job_id}:events"


def job_cancel(model: str, job_id: str) -> str:
    """Set when a client cancels the job, so a worker that picks it up later skips it."""
    return f"{_q(model)}job:{job_id}:cancel"


def finished_stream(model: str) -> str:
    """One entry (``j``: the job id) per job of the model that ended, written with its final
    event (MAXLEN ~ ``FINISHED_MAXLEN``): a gateway waiting only for results reads this one
    stream instead of every token event of every job (gateway/hub.py)."""
    return _q(model) + "finished"


FINISHED_MAXLEN = 10_000


def gateway_wake(model: str, gateway_id: str) -> str:
    """A gateway's wake stream for the model: written when it starts following another job's
    events, so its one blocked read of them all starts over (gateway/hub.py)."""
    return f"{_q(model)}gw:{gateway_id}:wake"


def cost_profile(model: str) -> str:
    """The model's startup cost profile (``shared.profile.CostProfile`` as JSON), written by
    its workers when they have measured it and read by the planner as its policies' prior."""
    return _q(model) + "profile"


def job_model(job_id: str) -> str:
    """Which model's keys hold the job (the gateway's lookup from a bare job id)."""
    return f"{PREFIX}jobmodel:{job_id}"


def file_key(file_id: str) -> str:
    """Hash of an uploaded file (``POST /v1/files``): owner, purpose, name, content."""
    return f"{PREFIX}file:{file_id}"


def batch_key(batch_id: str) -> str:
    """Hash of a batch (``POST /v1/batches``): owner, status, its requests' job ids."""
    return f"{PREFIX}batch:{batch_id}"


def owner_batches(owner: str) -> str:
    """Sorted set of an owner's batch ids by creation time (``GET /v1/batches``)."""
    return f"{PREFIX}owner:{owner or '-'}:batches"


WEBHOOKS = PREFIX + "webhooks"  # sorted set "<job|batch>:<id>" -> when its next attempt is due


def webhook(member: str) -> str:
    """Hash of one webhook delivery (url, owner, attempts)."""
    return f"{PREFIX}webhook:{member}"


def owner_jobs(owner: str) -> str:
    """Sorted set of an owner's job ids, scored by submit time (``GET /v1/jobs``)."""
    return f"{PREFIX}owner:{owner or '-'}:jobs"


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
PLANNER_POLICIES = PREFIX + "planner:policies"  # JSON: each policy's declared parameters (the swap check)
PLANNER_STATUS = PREFIX + "planner:status"  # JSON: policy, drafter weights, ts (for `nightjar top`)

# Workers announce themselves (hash worker_id -> msgpack info, refreshed with the heartbeat).
WORKERS = PREFIX + "workers"

JOB_TTL_S = 24 * 3600  # job status, result and event stream live this long after the last write
