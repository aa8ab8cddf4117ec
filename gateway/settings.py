"""What the gateway can be told: each field reads ``NIGHTJAR_<FIELD>`` (``shared.settings``);
``nightjar gateway`` / ``up`` flags override it. The descriptions are the flags' help."""

from __future__ import annotations

from pydantic import Field

from shared.settings import CommaList, EnvSettings

MiB = 1024 * 1024


class GatewaySettings(EnvSettings):
    redis_url: str = Field(
        default="memory://",
        description="the job store: redis://host:port/db, redis+sentinel://, redis+cluster:// or memory:// "
        "(embedded, this process only)",
    )
    host: str = Field(default="127.0.0.1", description="address the HTTP server binds")
    port: int = Field(default=8000, ge=0, le=65535, description="port the HTTP server listens on")
    max_queue: int = Field(
        default=1000, ge=1, description="new jobs get a 429 while this many are waiting or running"
    )
    max_batch_queue: int = Field(
        default=100_000,
        ge=1,
        description="batch (/v1/batches) jobs waiting per model before a batch's further lines fail "
        "with queue_full; they never count against max_queue, and run only when no live job waits",
    )
    admin_token: str | None = Field(
        default=None, description="bearer token of the /admin routes; none: they answer 403"
    )
    default_max_tokens: int = Field(
        default=256, ge=1, description="max_tokens of a chat completion that sets none"
    )
    default_model: str = Field(
        default="",
        description="model of requests naming none while no worker is live (with require_worker off)",
    )
    keepalive_s: float = Field(
        default=15.0, gt=0, description="seconds between SSE comment lines while a job is quiet"
    )
    worker_timeout_s: float = Field(
        default=15.0, gt=0, description="a worker silent this long is not live (/v1/models, readiness)"
    )
    api_keys: CommaList = Field(
        default=(),
        description="API keys the /v1 routes accept (Bearer); each key sees only its own jobs; none: open",
    )
    auth_failures_per_min: int = Field(
        default=20,
        ge=0,
        description="failed API-key attempts a client address may make in a minute; past them its "
        "requests get a 429 with Retry-After instead of a 401 (0: no limit)",
    )
    metrics_require_key: bool = Field(
        default=False, description="with API keys configured, /metrics needs one too (Bearer)"
    )
    docs_require_key: bool = Field(
        default=True,
        description="with API keys configured, /docs, /redoc and /openapi.json need one too (Bearer)",
    )
    rate_limit_rps: float = Field(
        default=0.0, ge=0, description="requests/s per API key (per client address when open); 0: no limit"
    )
    rate_limit_burst: int = Field(
        default=0, ge=0, description="rate-limit bucket size; 0: the rate rounded up"
    )
    require_worker: bool = Field(
        default=True, description="submits answer 503 while no live, non-draining worker exists"
    )
    request_timeout_s: float = Field(
        default=600.0, gt=0, description="seconds before an unfinished OpenAI request is cancelled with a 504"
    )
    outage_grace_s: float = Field(
        default=30.0,
        ge=0,
        description="seconds a request in flight rides out a Redis outage, resuming where it was; past "
        "them it is answered 503 and its job cancelled (0: at once; gateway/outage.py)",
    )
    result_ttl_s: float = Field(
        default=24 * 3600.0,
        gt=0,
        description="seconds a job's record, result and events live after its last write",
    )
    webhook_secret: str | None = Field(
        default=None, description="HMAC-SHA256 key that signs webhook deliveries; none: unsigned"
    )
    webhook_max_attempts: int = Field(
        default=12, ge=1, description="webhook delivery attempts before it is dropped"
    )
    max_body_bytes: int = Field(default=4 * MiB, ge=1, description="larger request bodies get a 413")
    body_timeout_s: float = Field(
        default=30.0, gt=0, description="a request body not received within this gets a 408"
    )
    send_timeout_s: float = Field(
        default=60.0, gt=0, description="a client that reads nothing this long is dropped"
    )
    max_concurrency: int = Field(default=8192, ge=1, description="HTTP requests in flight before a 503")
    header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="a connection must send complete request headers within this (uvicorn)",
    )
    timeout_keep_alive_s: float = Field(
        default=5.0, gt=0, description="idle keep-alive connections close after this"
    )
    shutdown_timeout_s: float = Field(
        default=30.0, gt=0, description="on SIGTERM, open responses get this long to end"
    )
