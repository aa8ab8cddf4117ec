"""What the gateway can be told."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class GatewaySettings:
    redis_url: str = "memory://"
    max_queue: int = 1000  # reject new jobs (429) while this many are waiting or running
    admin_token: str | None = None  # bearer token of /admin routes; None disables them (503)
    default_max_tokens: int = 256  # chat completions without max_tokens
    keepalive_s: float = 15.0  # SSE comment lines while a job is quiet
    worker_timeout_s: float = 15.0  # a worker silent this long is not listed by /v1/models
