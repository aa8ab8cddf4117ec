"""The worker's running jobs: one owner that admits them, feeds them and retires them."""

from __future__ import annotations

from collections.abc import Iterator

from shared.loops import Signal
from worker.job_run import JobRun


class RunningJobs:
    """Jobs this worker holds, from their start until their final write landed (or until
    the job was lost to another worker). ``ended`` fires whenever one is retired."""

    def __init__(self, max_jobs: int) -> None:
        self.max_jobs = max_jobs
        self.ended = Signal()
        self._runs: dict[str, JobRun] = {}

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
        if run.job_id in self._runs:
            raise ValueError(f"job {run.job_id} is running here already")
        self._runs[run.job_id] = run

    def retire(self, job_id: str) -> JobRun | None:
        run = self._runs.pop(job_id, None)
        if run is not None:
            self.ended.fire()
        return run

    def held(self) -> list[tuple[str, int, bytes]]:
        """(job id, lease, entry id) of every job held: what claim renewal renews."""
        return [(r.job_id, r.lease, r.entry_id) for r in self._runs.values()]
