"""Everything a worker can be told, with defaults that suit one machine."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import Any

from worker.profiling import ProfileSettings

RENEWALS_PER_CLAIM_IDLE = 3  # a live worker renews this many times within claim_idle_s
MAX_SWEEP_S = 2.0  # the XAUTOCLAIM sweep's period at most


def claim_timing(claim_idle_s: float) -> tuple[float, float]:
    """(renewal period, sweep period) for ``claim_idle_s``: what bounds failover.

    A running job's entry is claimed again (its idle time reset) every renewal period, so a
    live worker's jobs never look idle: 3 renewals fit in ``claim_idle_s`` (a loop stalled
    for two of them loses nothing). A dead worker's last renewal or delivery came at the
    latest when it died, so its jobs are idle past ``claim_idle_s`` by then + ``claim_idle_s``;
    another worker sweeps (XAUTOCLAIM) every sweep period — and its blocked read of new jobs
    never outlasts the next sweep (``JobIntake.block_ms``) — so with a free slot an orphan
    is taken within ``claim_idle_s`` + the sweep period: at most ``claim_idle_s / 6`` and
    2 s, which leaves the rest of the 5 s promised (docs/reliability.md) to admission."""
    return claim_idle_s / RENEWALS_PER_CLAIM_IDLE, min(claim_idle_s / 6, MAX_SWEEP_S)


def default_worker_id() -> str:
    # Stable across restarts of one container (pid 1), so a restarted worker finds its own
    # pending jobs; set NIGHTJAR_WORKER_ID for a fixed identity elsewhere.
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass
class WorkerSettings:
    model_dir: str
    redis_url: str = "memory://"
    worker_id: str = field(default_factory=default_worker_id)
    model_name: str = ""  # served name; the model directory's name when empty
    max_jobs: int = 16  # jobs held at once (running or queued in the engine)
    engine: dict[str, Any] = field(default_factory=dict)  # keyword options of the engine
    drafters: list[str] = field(default_factory=list)  # drafter model directories
    ngram: bool = True  # also offer the prompt-lookup drafter "ngram"
    block_ms: int = 2000  # XREADGROUP / XREAD BLOCK
    # A job idle this long on a dead consumer is taken over: the one setting of failover
    # timing. The renewal period and the sweep period derive from it (``claim_timing``).
    claim_idle_s: float = 30.0
    renew_s: float = 0.0  # period of this worker's claim renewals; 0: derived from claim_idle_s
    autoclaim_s: float = 0.0  # period of XAUTOCLAIM sweeps; 0: derived from claim_idle_s
    max_deliveries: int = 3  # starts of one job before it is dead-lettered
    heartbeat_s: float = 1.0  # idle telemetry and registration period
    lag_refresh_s: float = 0.5  # how stale the job-stream lag in telemetry may be
    decision_check_s: float = 1.0  # how often a decision's staleness is checked
    progress_s: float = 0.5  # a final_only job's tokens are written at most this often (job_run.py)
    drain_timeout_s: float = 30.0  # on SIGTERM: finish running jobs this long, then hand them back
    result_ttl_s: float = 24 * 3600  # job record, result and events live this long after the last write
    metrics_port: int | None = None  # serve Prometheus /metrics here (0: any free port)
    metrics_host: str = "127.0.0.1"
    # The startup cost profile (worker/profiling.py); off unless asked for here, on in
    # ``nightjar worker`` / ``up`` unless --no-profile.
    profile: ProfileSettings = field(default_factory=lambda: ProfileSettings(enabled=False))

    def __post_init__(self) -> None:
        if not self.claim_idle_s > 0:
            raise ValueError("claim_idle_s must be positive")
        renew_s, sweep_s = claim_timing(self.claim_idle_s)
        self.renew_s = self.renew_s or renew_s
        self.autoclaim_s = self.autoclaim_s or sweep_s
        if self.renew_s >= self.claim_idle_s:
            raise ValueError("renew_s must be below claim_idle_s, or running jobs get taken over")
        if self.max_jobs < 1 or self.max_deliveries < 1:
            raise ValueError("max_jobs and max_deliveries must be at least 1")
