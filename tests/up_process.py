"""`nightjar up` as its own process, as a user runs it, for the tests that need one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.e2e.conftest import free_port

ROOT = Path(__file__).resolve().parents[1]


class Up:
    """A `nightjar up` process whose output goes to a file (read, never waited on blindly)."""

    def __init__(self, tmp: Path, cache: Path, *args: str) -> None:
        """Start it with ``args`` on a free port; its output goes to ``tmp``, its cache
        (cost profiles, the store's announcement) to ``cache``."""
        self.port = free_port()
        self.log = tmp / f"up-{self.port}.log"
        self.env = {**os.environ, "NIGHTJAR_CACHE": str(cache), "PYTHONUNBUFFERED": "1"}
        self.env.pop("NIGHTJAR_REDIS_URL", None)
        cmd = [sys.executable, "-m", "nightjar", "up", "--port", str(self.port), "--threads", "1", *args]
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env, cwd=ROOT)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, needle: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = self.text()
            if needle in text:
                return text
            assert self.proc.poll() is None, f"nightjar up exited ({self.proc.returncode}):\n{text[-3000:]}"
            time.sleep(0.1)
        raise AssertionError(f"no {needle!r} within {timeout_s} s:\n{self.text()[-3000:]}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                return self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()
