"""The worker's running jobs: one owner that admits them, feeds them and retires them."""

from __future__ import annotations

from collections.abc import Iterator

from shared.loops import Signal
from worker.job_run import JobRun

REMEMBERED_CANCELS = 1024  # cancels of jobs not held here, kept for a job being admitted


class RunningJobs:
    """Jobs this worker holds, from their start until their final write landed (or until
    the job was lost to another worker). ``ended`` fires whenever one is retired."""

    def __init__(self, max_jobs: int) -> None:
        self.max_jobs = max_jobs
        self.ended = Signal()
        self._runs: dict[str, JobRun] = {}
        self._cancels: dict[str, None] = {}  # oldest first

    def __len__(self) -> int:
        return len(self._runs)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._runs

    def __iter__(self) -> Iterator[JobRun]:
        return iter(list(self._runs.values()))

    def get(self, job_id: str) -> JobRun | None:
        return self._runs.get(job_id)

    def free_slots(self) -> int:
        return self.max_jobs - len(self._runs)

    def admit(self, run: JobRun) -> None:
        """Hold ``run``; ``run.cancelled`` turns true if its cancel came already."""
        if run.job_id in self._runs:
            raise ValueError(f"job {run.job_id} is running here already")
        self._runs[run.job_id] = run
        if run.job_id in self._cancels:
            del self._cancels[run.job_id]
            run.cancelled = True

    def cancel(self, job_id: str) -> JobRun | None:
        """A cancel broadcast: the job's run, marked cancelled, when held here. Otherwise
        the job id is remembered (the last ``REMEMBERED_CANCELS``): the job may be between
        its start script, which saw no cancel yet, and ``admit``."""
        run = self._runs.get(job_id)
        if run is not None:
            run.cancelled = True
            return run
        self._cancels[job_id] = None
        while len(self._cancels) > REMEMBERED_CANCELS:
            del self._cancels[next(iter(self._cancels))]
        return None

    def retire(self, job_id: str) -> JobRun | None:
        run = self._runs.pop(job_id, None)
        if run is not None:
            self.ended.fire()
        return run

    def held(self) -> list[tuple[str, int, bytes]]:
        """(job id, lease, entry id) of every job held: what claim renewal renews."""
        return [(r.job_id, r.lease, r.entry_id) for r in self._runs.values()]
