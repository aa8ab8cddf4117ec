"""``nightjar --log-format json``: a real gateway process writes one JSON object a line, and
the lines about a request (uvicorn's access line included) carry its X-Request-Id."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

import httpx
import pytest
import redis

from tests.e2e.conftest import free_port

pytestmark = pytest.mark.redis

REDIS_URL = "redis://127.0.0.1:6379/12"


def test_a_gateway_logs_json_with_request_ids() -> None:
    redis.Redis.from_url(REDIS_URL).flushdb()
    port = free_port()
    env = {**os.environ, "NIGHTJAR_REDIS_URL": REDIS_URL}
    cmd = [sys.executable, "-m", "nightjar", "--log-format", "json", "gateway", "--port", str(port)]
    # uvicorn writes its access lines to stdout, every other line to stderr: read both.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or ()), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                got = httpx.get(f"http://127.0.0.1:{port}/health", headers={"X-Request-Id": "rid-json-1"})
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline and proc.poll() is None, lines
                time.sleep(0.1)
        assert got.headers["x-request-id"] == "rid-json-1"
        access: list[dict[str, Any]] = []
        while not access and time.monotonic() < deadline:
            records = [json.loads(line) for line in list(lines)]  # every line is one JSON object
            access = [
                r for r in records if r["logger"] == "uvicorn.access" and r.get("request_id") == "rid-json-1"
            ]
            time.sleep(0.05)
        assert access and "GET /health" in access[0]["msg"], lines
        assert {"ts", "level", "logger", "msg"} <= set(access[0])
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        reader.join(timeout=10)
        redis.Redis.from_url(REDIS_URL).flushdb()
    records = [json.loads(line) for line in lines]
    assert any("no API key configured" in r["msg"] for r in records)  # the app's own lines too
