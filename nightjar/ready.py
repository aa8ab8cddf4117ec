"""The ready line: ``nightjar up`` and ``nightjar gateway`` print one line on stdout,

    ready: http://127.0.0.1:8000 model=smollm2-135m-instruct drafters=... policy=nightjar

once the gateway can answer: its store answers and a live worker registered for a model
(``gateway.health.readiness``, the same truth as ``GET /health/ready``). Until then
requests get 503 with Retry-After, as /health/ready says; uvicorn's own "running on" line
only means the port is open. The policy is the latest decision's; the line waits up to
``POLICY_WAIT_S`` for the planner's first one, so it names what runs.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import anyio

from gateway.health import readiness
from gateway.store import JobStore

POLICY_WAIT_S = 3.0


def ready_line(url: str, body: dict[str, Any]) -> str:
    models = ",".join(body.get("models") or []) or "none"
    drafters = ",".join(body.get("drafters") or []) or "none"
    policy = (body.get("planner") or {}).get("policy") or "none yet (workers fall back to γ = 0)"
    return f"ready: {url} model={models} drafters={drafters} policy={policy}"


def _say(text: str) -> None:
    print(text, file=sys.stdout, flush=True)


async def announce_ready(
    store: JobStore, url: Callable[[], str], say: Callable[[str], None] = _say, every_s: float = 0.1
) -> str:
    """Wait until ready, print the line, return it. ``url()`` is asked then (the server's
    port may be chosen by the OS when it binds)."""
    policy_deadline: float | None = None
    while True:
        ok, body = await readiness(store)
        if ok:
            has_policy = bool((body.get("planner") or {}).get("policy"))
            policy_deadline = policy_deadline or time.monotonic() + POLICY_WAIT_S
            if has_policy or time.monotonic() >= policy_deadline:
                line = ready_line(url(), body)
                say(line)
                return line
        await anyio.sleep(every_s)


def server_url(server: Any, host: str, port: int) -> str:
    """``http://host:port`` of a uvicorn server, its real port where it asked for any (0)."""
    if port == 0:
        for s in getattr(server, "servers", []) or []:
            for sock in s.sockets:
                port = int(sock.getsockname()[1])
                break
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    return f"http://{shown}:{port}"
