"""What the serving benchmarks read about processes from /proc: CPU seconds, pids, load."""

from __future__ import annotations

import os
import subprocess

_HZ = os.sysconf("SC_CLK_TCK")  # /proc/PID/stat counts CPU time in these ticks


def cpus(spec: str) -> set[int]:
    """``"0,1"`` as a CPU set (for ``os.sched_setaffinity``)."""
    return {int(c) for c in spec.split(",") if c.strip()}


def _stat_fields(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of every thread of ``pid`` so far."""
    fields = _stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / _HZ


def cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of all of ``pids`` so far."""
    return sum(process_cpu_s(p) for p in pids)


def pids_matching(pattern: str) -> list[int]:
    """Processes whose command line matches ``pattern`` (``pgrep -f``), this one left out."""
    got = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()
    return [int(p) for p in got if int(p) != os.getpid()]


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())
