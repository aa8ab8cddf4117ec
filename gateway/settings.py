"""What the gateway can be told."""

from __future__ import annotations

from dataclasses import dataclass

MiB = 1024 * 1024


@dataclass
class GatewaySettings:
    redis_url: str = "memory://"
    max_queue: int = 1000  # reject new jobs (429) while this many are waiting or running
    admin_token: str | None = None  # bearer token of /admin routes; None closes them (403)
    default_max_tokens: int = 256  # chat completions without max_tokens
    default_model: str = ""  # requests naming no model while no worker is live (require_worker off)
    keepalive_s: float = 15.0  # SSE comment lines while a job is quiet
    worker_timeout_s: float = 15.0  # a worker silent this long is not live (/v1/models, readiness)
    # Security: API keys of the /v1 routes (empty: open, with a warning at start).
    api_keys: tuple[str, ...] = ()
    rate_limit_rps: float = 0.0  # per API key (per client address when open); 0 = no limit
    rate_limit_burst: int = 0  # bucket size; 0 = max(1, ceil(rate_limit_rps))
    # Admission and deadlines.
    require_worker: bool = True  # submits answer 503 while no live, non-draining worker exists
    request_timeout_s: float = 600.0  # an OpenAI request still unfinished after this is cancelled: 504
    # A reader waiting for a job's events rides out a Redis outage this long, resuming where it
    # was; past it an OpenAI request gets a 503 and its job is cancelled (gateway/outage.py).
    outage_grace_s: float = 30.0
    result_ttl_s: float = (
        24 * 3600.0
    )  # the job record written at submit (status, owner, result) lives this long
    # Webhooks (gateway/webhooks.py): events signed with HMAC-SHA256 when a secret is set.
    webhook_secret: str | None = None
    webhook_max_attempts: int = 12  # then the delivery is dropped (logged)
    # HTTP hygiene.
    max_body_bytes: int = 4 * MiB  # larger request bodies: 413
    body_timeout_s: float = 30.0  # a request body not received within this: 408
    send_timeout_s: float = 60.0  # a client that reads nothing for this long is dropped
    max_concurrency: int = 8192  # requests in flight; past it: 503 with Retry-After
    header_timeout_s: float = 10.0  # uvicorn: a connection must send complete request headers within this
    timeout_keep_alive_s: float = 5.0  # uvicorn: idle keep-alive connections close after this
    shutdown_timeout_s: float = 30.0  # uvicorn: on SIGTERM, open responses get this long to end
