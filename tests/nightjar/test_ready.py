"""The ready line says the same as /health/ready: nothing while no worker is registered, one
line naming model, drafters and policy once one is."""

from __future__ import annotations

import time
from typing import Any

import anyio
import httpx
import pytest
import redis.asyncio as aioredis

from gateway.app import create_app
from gateway.settings import GatewaySettings
from nightjar import ready as ready_mod
from nightjar.ready import announce_ready, ready_line, server_url
from shared import codec, keys
from shared.control import Decision, WorkerInfo

pytestmark = pytest.mark.anyio


async def test_the_line_comes_when_ready_and_says_what_serves(
    r: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = create_app(GatewaySettings(), redis=r)
    said: list[str] = []
    checks: list[bool] = []  # each readiness check announce_ready made, and its answer
    checked_thrice = anyio.Event()
    readiness = ready_mod.readiness

    async def counted(store: Any) -> Any:
        got = await readiness(store)
        checks.append(got[0])
        if len(checks) >= 3:
            checked_thrice.set()
        return got

    monkeypatch.setattr(ready_mod, "readiness", counted)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as gw:
        async with anyio.create_task_group() as tg:
            tg.start_soon(announce_ready, app.state.store, lambda: "http://127.0.0.1:8000", said.append, 0.01)
            with anyio.fail_after(10):  # no worker: not ready (checked three times), no line
                await checked_thrice.wait()
            assert not any(checks) and said == [] and (await gw.get("/health/ready")).status_code == 503
            decision = Decision(version=3, policy="nightjar", created_at=time.time())
            await r.set(keys.DECISION_LATEST, codec.encode(decision))
            info = WorkerInfo(worker_id="w1", model="smol", drafters=["smol-eagle-chat", "ngram"])
            await r.hset(keys.WORKERS, "w1", codec.encode(info))
            with anyio.fail_after(10):
                while not said:
                    await anyio.sleep(0.01)
        ready = await gw.get("/health/ready")
    assert said == ["ready: http://127.0.0.1:8000 model=smol drafters=ngram,smol-eagle-chat policy=nightjar"]
    body = ready.json()
    assert ready.status_code == 200 and body["models"] == ["smol"] and body["planner"]["policy"] == "nightjar"
    assert body["drafters"] == ["ngram", "smol-eagle-chat"]


def test_the_line_without_a_decision_and_the_url_of_a_chosen_port() -> None:
    line = ready_line("http://h:1", {"models": ["m"], "drafters": [], "planner": {"policy": None}})
    assert line == "ready: http://h:1 model=m drafters=none policy=none yet (workers fall back to γ = 0)"

    class Sock:
        def getsockname(self) -> tuple[str, int]:
            return ("127.0.0.1", 43210)

    class Server:
        def __init__(self) -> None:
            self.servers = [type("S", (), {"sockets": [Sock()]})()]

    assert server_url(Server(), "0.0.0.0", 0) == "http://127.0.0.1:43210"
    assert server_url(None, "10.0.0.1", 8000) == "http://10.0.0.1:8000"
