"""Everything a worker can be told, with defaults that suit one machine: each field reads
``NIGHTJAR_<FIELD>`` (or the variable its alias names; ``shared.settings``), and the
``nightjar worker`` / ``up`` flags override it. The descriptions are the flags' help."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Literal

from pydantic import Field, PrivateAttr, model_validator

from shared.settings import CommaList, EnvSettings
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


class WorkerSettings(EnvSettings):
    model_dir: str | None = Field(
        default=None,
        validation_alias="NIGHTJAR_MODEL",
        description="model directory (Hugging Face format); none: SmolLM2-135M-Instruct when exported, "
        "else the bundled nj-target",
    )
    redis_url: str = Field(
        default="memory://", description="the job store (redis://host:port/db, memory://, ...)"
    )
    worker_id: str = Field(
        default_factory=default_worker_id, description="this worker's consumer name (host-pid)"
    )
    model_name: str = Field(
        default="",
        validation_alias="NIGHTJAR_SERVED_MODEL_NAME",
        description="the model's name in the API; empty: the model directory's name",
    )
    max_jobs: int = Field(default=16, ge=1, description="jobs held at once (running or queued in the engine)")
    engine: dict[str, Any] = Field(
        default_factory=dict, description="keyword options of the engine (EngineConfig fields)"
    )
    drafters: CommaList | None = Field(
        default=None,
        description="drafter model directories, comma-separated; 'none': no model drafter; unset: the "
        "bundled drafters of a bundled model",
    )
    ngram: bool = Field(default=True, description="also offer the prompt-lookup drafter 'ngram'")
    threads: int | None = Field(default=None, ge=1, description="torch threads; unset: torch's own choice")
    dtype: Literal["auto", "fp32", "float32", "bf16", "bfloat16", "fp16", "float16"] = Field(
        default="auto",
        description="weights and compute: auto serves a directory's .gguf from its blocks on CPU (else "
        "float32 on CPU, bfloat16 on CUDA); fp32 reads the safetensors beside a GGUF or dequantises it",
    )
    block_ms: int = Field(default=2000, ge=1, description="milliseconds of one blocking XREADGROUP / XREAD")
    claim_idle_s: float = Field(
        default=30.0,
        gt=0,
        description="seconds before another worker takes over the jobs of one that died; claim renewals "
        "(every third of it) and sweeps for orphans (every sixth, at most 2 s) follow from it, so an "
        "orphan resumes within it + 5 s",
    )
    # Not flags: failover timing has one setting, claim_idle_s (``claim_timing``); tests may pin these.
    renew_s: float = Field(
        default=0.0, ge=0, description="claim renewal period; 0: derived from claim_idle_s"
    )
    autoclaim_s: float = Field(
        default=0.0, ge=0, description="XAUTOCLAIM sweep period; 0: derived from claim_idle_s"
    )
    max_deliveries: int = Field(default=3, ge=1, description="starts of one job before it is dead-lettered")
    heartbeat_s: float = Field(
        default=1.0, gt=0, description="seconds between registrations and idle telemetry"
    )
    lag_refresh_s: float = Field(
        default=0.5, gt=0, description="how stale the job-stream lag in telemetry may be"
    )
    decision_check_s: float = Field(
        default=1.0, gt=0, description="how often a decision's staleness is checked"
    )
    progress_s: float = Field(
        default=0.5,
        gt=0,
        description="seconds between writes of the tokens of a job whose client awaits only its result "
        "(a non-streaming completion); streamed jobs are written every step",
    )
    drain_timeout_s: float = Field(
        default=30.0, ge=0, description="on SIGTERM, seconds to finish running jobs before handing them back"
    )
    result_ttl_s: float = Field(
        default=24 * 3600.0,
        gt=0,
        description="seconds a job's record, result and events live after its last write",
    )
    metrics_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="serve Prometheus /metrics on this port (0: any free one); unset: none",
    )
    metrics_host: str = Field(default="127.0.0.1", description="address /metrics binds")
    # The startup cost profile (worker/profiling.py, cached by worker/profile_cache.py): off
    # here, so an embedded worker (tests, benchmarks) does not spend its budget unless asked;
    # `nightjar worker` / `up` turn it on (nightjar/cli.py, SERVING_DEFAULTS).
    profile: bool = Field(
        default=False, description="measure the startup cost profile (the planner's prior) before taking jobs"
    )
    profile_budget_s: float = Field(
        default=60.0, gt=0, description="seconds the cost profile may take at most"
    )
    profile_cache: bool = Field(
        default=True,
        description="reuse the cost profile cached for this model, drafters, machine and code (under "
        "NIGHTJAR_CACHE) and measure it again when idle",
    )
    profile_reps: int = Field(
        default=5,
        ge=1,
        description="rounds of the startup cost profile over the batch sizes, the fastest of each point "
        "kept, within the budget",
    )
    profile_idle_s: float = Field(
        default=10.0, gt=0, description="seconds of idleness before a cached cost profile is measured again"
    )
    profile_shape: ProfileSettings | None = Field(
        default=None,
        description="what the profile measures (batch sizes, γ, rounds); none: ProfileSettings()",
    )

    # renew_s and autoclaim_s as given (0: derived from claim_idle_s), kept so a copy with
    # another claim_idle_s derives them again (``model_copy``) instead of keeping stale ones.
    _pinned: tuple[float, float] = PrivateAttr(default=(0.0, 0.0))

    @model_validator(mode="after")
    def _renew_below_claim(self) -> WorkerSettings:
        self._pinned = (self.renew_s, self.autoclaim_s)
        self._derive()
        return self

    def _derive(self) -> None:
        """renew_s and autoclaim_s: as pinned, else from claim_idle_s (``claim_timing``)."""
        renew_s, sweep_s = claim_timing(self.claim_idle_s)
        self.renew_s = self._pinned[0] or renew_s
        self.autoclaim_s = self._pinned[1] or sweep_s
        if self.renew_s >= self.claim_idle_s:
            raise ValueError("renew_s must be below claim_idle_s, or running jobs get taken over")

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> WorkerSettings:
        """A copy; one given another claim_idle_s (or renew_s / autoclaim_s) derives the
        failover timing again, as a new record would."""
        copy = super().model_copy(update=update, deep=deep)
        if update and {"claim_idle_s", "renew_s", "autoclaim_s"} & set(update):
            renew_s, autoclaim_s = self._pinned
            copy._pinned = (update.get("renew_s", renew_s), update.get("autoclaim_s", autoclaim_s))
            copy._derive()
        return copy

    def profiling(self) -> ProfileSettings:
        """What the startup profile measures, within ``profile_budget_s``, when ``profile``."""
        shape = self.profile_shape or ProfileSettings()
        return replace(shape, enabled=self.profile, budget_s=self.profile_budget_s, reps=self.profile_reps)

    def model_path(self) -> str:
        """The model directory (the command line resolves an unset one before a worker starts)."""
        if not self.model_dir:
            raise ValueError("WorkerSettings.model_dir is not set")
        return self.model_dir
