"""``nightjar up`` as a user runs it, in a subprocess on a free loopback port: the bundled
target with a drafter, a speculating static policy, for the tests that drive the gateway from
outside (the chat page in a browser, ``nightjar chat``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.e2e.conftest import free_port

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "models" / "nj-target"
DRAFTER = ROOT / "models" / "nj-draft-prose"


@contextmanager
def nightjar_up(gamma: int = 2, timeout_s: float = 180.0, log: Path | None = None) -> Iterator[str]:
    """Serve nj-target with nj-draft-prose under ``static gamma=<gamma>`` (the drafter named, so
    every decoding step drafts with it); yield the base URL once /health/ready says 200."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [
        sys.executable, "-m", "nightjar", "up",
        "--model", str(TARGET), "--drafter", str(DRAFTER), "--no-ngram", "--no-profile",
        "--host", "127.0.0.1", "--port", str(port),
        "--policy", "static", "--set", f"gamma={gamma}", "--set", f"drafter={DRAFTER.name}",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = open(log, "wb") if log is not None else subprocess.DEVNULL  # noqa: SIM115 - closed below
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout_s
        while not _ready(base):
            if proc.poll() is not None:
                raise AssertionError(f"nightjar up exited with {proc.returncode} (log: {log})")
            if time.monotonic() > deadline:
                raise AssertionError(f"nightjar up was not ready within {timeout_s}s (log: {log})")
            time.sleep(0.2)
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if out is not subprocess.DEVNULL:
            out.close()


def _ready(base: str) -> bool:
    try:
        return httpx.get(base + "/health/ready", timeout=5).status_code == 200
    except httpx.TransportError:
        return False
