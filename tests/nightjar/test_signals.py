"""SIGTERM in every phase of a process's life, start included: each ``nightjar`` command,
run as a real process, exits within 5 s of SIGTERM while it waits for Redis and while a
worker measures its startup cost profile (which takes a minute on SmolLM2).

Nothing listens on the Redis port these processes are given (a port just found free), so
they wait for Redis as long as the test likes; the profile is made long enough to be caught
(``--profile-budget 600 --profile-reps 1000``). Every wait is for a log line, with a
deadline; the one timed bound is the promise itself.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import free_port
from tests.tiny_models import build_llama

pytestmark = pytest.mark.slow

EXIT_BOUND_S = 5.0
START_TIMEOUT_S = 120.0  # interpreters importing torch on 2 shared cores
LONG_PROFILE = ["--profile-budget", "600", "--profile-reps", "1000"]
SMALL = ["--engine-opt", "num_blocks=256", "--threads", "1"]  # the default 1 GiB of KV is slow to set up
PROFILING = "measuring the cost profile"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_llama(tmp_path_factory.mktemp("signals") / "tiny-llama")


@pytest.fixture
def no_redis() -> str:
    return f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there


class Process:
    """A ``python -m nightjar`` process whose output goes to a file the test can wait on."""

    def __init__(self, argv: list[str], log: Path) -> None:
        self.log = log
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "nightjar", "--log-level", "info", *argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for_line(self, needle: str, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if needle in self.text():
                return
            if self.proc.poll() is not None:
                code = self.proc.returncode
                raise AssertionError(f"exited {code} before {needle!r}:\n{self.text()[-3000:]}")
            time.sleep(0.05)
        raise AssertionError(f"no {needle!r} within {timeout_s}s:\n{self.text()[-3000:]}")

    def sigterm_exit_s(self) -> float:
        """Send SIGTERM; seconds until the process exited (SIGKILL past the bound + 10 s)."""
        sent = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=EXIT_BOUND_S + 10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return float("inf")
        return time.monotonic() - sent

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


Spawn = Callable[..., "Process"]


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Spawn]:
    started: list[Process] = []

    def start(*argv: str) -> Process:
        p = Process(list(argv), tmp_path / f"p{len(started)}.log")
        started.append(p)
        return p

    yield start
    for p in started:
        p.close()


def _assert_exits(p: Process, phase: str) -> None:
    took = p.sigterm_exit_s()
    assert took <= EXIT_BOUND_S, f"{phase}: exited {took:.1f}s after SIGTERM:\n{p.text()[-3000:]}"
    assert p.proc.returncode == 0, f"{phase}: exit code {p.proc.returncode}:\n{p.text()[-3000:]}"


def test_a_worker_waiting_for_redis_exits_on_sigterm(spawn: Spawn, tiny: Path, no_redis: str) -> None:
    p = spawn("worker", "--model", str(tiny), *SMALL, "--no-profile", "--redis-url", no_redis)
    p.wait_for_line("waiting for Redis")
    _assert_exits(p, "worker waiting for Redis")


def test_a_worker_measuring_its_profile_exits_on_sigterm(spawn: Spawn, tiny: Path, no_redis: str) -> None:
    p = spawn("worker", "--model", str(tiny), *SMALL, *LONG_PROFILE, "--redis-url", no_redis)
    p.wait_for_line(PROFILING)
    p.wait_for_line("round 1 done")  # well inside the measurement, not before it
    _assert_exits(p, "worker profiling")


def test_up_measuring_its_profile_exits_on_sigterm(spawn: Spawn, tiny: Path) -> None:
    port = str(free_port())
    p = spawn("up", "--model", str(tiny), *SMALL, *LONG_PROFILE, "--port", port, "--policy", "static")
    p.wait_for_line(PROFILING)
    p.wait_for_line("round 1 done")
    _assert_exits(p, "up profiling")


def test_up_waiting_for_redis_exits_on_sigterm(spawn: Spawn, tiny: Path, no_redis: str) -> None:
    port = str(free_port())
    p = spawn("up", "--model", str(tiny), *SMALL, "--no-profile", "--redis-url", no_redis, "--port", port,
              "--policy", "static")  # fmt: skip
    p.wait_for_line(": waiting for Redis")
    p.wait_for_line("planner: waiting for Redis")
    _assert_exits(p, "up waiting for Redis")


def test_a_gateway_without_redis_exits_on_sigterm(spawn: Spawn, no_redis: str) -> None:
    p = spawn("gateway", "--redis-url", no_redis, "--port", str(free_port()))
    p.wait_for_line("Application startup complete")
    _assert_exits(p, "gateway without Redis")


def test_a_planner_waiting_for_redis_exits_on_sigterm(spawn: Spawn, no_redis: str) -> None:
    p = spawn("planner", "--redis-url", no_redis, "--policy", "static")
    p.wait_for_line("planner: waiting for Redis")
    _assert_exits(p, "planner waiting for Redis")
