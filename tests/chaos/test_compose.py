"""compose.yaml and the Dockerfile, checked without Docker: the deployment promises of
docs/reliability.md ("Deployment") read from the files themselves."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gateway.app import create_app
from gateway.settings import GatewaySettings
from nightjar.cli import build_parser
from worker.settings import WorkerSettings

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("gateway", "planner", "worker")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "compose.yaml").read_text())  # merge keys (<<) resolved
    assert isinstance(doc, dict)
    return doc


def _seconds(text: str) -> float:
    """A compose duration ("45s", "1m30s") in seconds."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", str(text))
    assert parts and "".join(n + u for n, u in parts) == str(text), text
    return sum(float(n) * units[u] for n, u in parts)


def _command(svc: dict[str, Any]) -> list[str]:
    cmd = svc["command"]
    return shlex.split(cmd) if isinstance(cmd, str) else [str(x) for x in cmd]


def test_redis_persists_to_a_named_volume_and_has_a_healthcheck(compose: dict[str, Any]) -> None:
    redis = compose["services"]["redis"]
    cmd = _command(redis)
    assert cmd[0] == "redis-server"
    assert cmd[cmd.index("--appendonly") + 1] == "yes"
    data_dir = cmd[cmd.index("--dir") + 1] if "--dir" in cmd else "/data"
    volumes = [v.split(":") for v in redis["volumes"]]
    named = [v for v in volumes if v[1] == data_dir]
    assert named and named[0][0] in compose["volumes"], "Redis data must live in a named volume"
    test = redis["healthcheck"]["test"]
    assert "redis-cli" in test and "ping" in test
    assert redis.get("restart") in ("always", "unless-stopped")


def test_every_service_waits_for_a_healthy_redis_and_restarts(compose: dict[str, Any]) -> None:
    for name in SERVICES:
        svc = compose["services"][name]
        assert svc["depends_on"]["redis"]["condition"] == "service_healthy", name
        assert svc.get("restart") in ("always", "unless-stopped", "on-failure"), name
        assert svc["environment"]["NIGHTJAR_REDIS_URL"].startswith("redis://redis:6379"), name


def test_gateway_healthcheck_is_its_liveness_route(compose: dict[str, Any]) -> None:
    test = " ".join(compose["services"]["gateway"]["healthcheck"]["test"])
    assert "/health/live" in test and "8000" in test
    with TestClient(create_app(GatewaySettings())) as client:  # the route it calls answers
        resp = client.get("/health/live")
    assert resp.status_code == 200 and resp.json()["status"] == "ok"


def test_stop_grace_periods_cover_the_drains(compose: dict[str, Any]) -> None:
    worker = compose["services"]["worker"]
    drain = float(worker["environment"].get("NIGHTJAR_DRAIN_TIMEOUT_S", 30))
    assert _seconds(worker["stop_grace_period"]) > drain
    assert WorkerSettings.model_fields["drain_timeout_s"].default == 30  # what the compose value is sized for
    gw = compose["services"]["gateway"]
    assert _seconds(gw["stop_grace_period"]) > GatewaySettings().shutdown_timeout_s


def test_service_commands_parse(compose: dict[str, Any]) -> None:
    parser = build_parser()
    for name in SERVICES:
        cmd = _command(compose["services"][name])
        assert cmd[0] == "nightjar", name
        parser.parse_args(cmd[1:])  # exits (SystemExit) on an unknown flag


def test_dockerfile_installs_every_package() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    copied = set(re.findall(r"^COPY (\w+) \1$", dockerfile, flags=re.M))
    pyproject = (ROOT / "pyproject.toml").read_text()
    include = re.search(r"include = \[(.*?)\]", pyproject)
    assert include is not None
    packages = {p.strip().strip('"').rstrip("*") for p in include.group(1).split(",")}
    assert packages <= copied, packages - copied
