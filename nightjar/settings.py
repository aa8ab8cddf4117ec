"""The settings of the command line itself (the services' own are in their settings.py):
logging, ``nightjar submit``. Each field reads its ``NIGHTJAR_*`` variable (``shared.settings``);
the flags made from them (``nightjar.flags``) override it."""

from __future__ import annotations

import functools
from typing import Literal

from pydantic import Field, field_validator

from gateway.settings import GatewaySettings
from nightjar.flags import with_defaults
from nightjar.options import STANDALONE_REDIS
from planner.settings import PlannerSettings
from shared.settings import EnvSettings
from worker.settings import WorkerSettings

# What the commands change of the services' defaults: the services of `up` share its embedded
# store (the records' own default, memory://); a service started on its own talks to a real
# Redis; a worker started from the command line measures its cost profile (an embedded one,
# in tests and benchmarks, does not unless asked).
SERVING_DEFAULTS = {"profile": True}


@functools.cache
def gateway_settings(standalone: bool) -> type[GatewaySettings]:
    """The gateway's settings record as ``nightjar gateway`` (standalone) or ``up`` builds it."""
    return with_defaults(GatewaySettings, redis_url=STANDALONE_REDIS) if standalone else GatewaySettings


@functools.cache
def worker_settings(standalone: bool) -> type[WorkerSettings]:
    """The worker's settings record as ``nightjar worker`` (standalone) or ``up`` builds it."""
    extra = {"redis_url": STANDALONE_REDIS} if standalone else {}
    return with_defaults(WorkerSettings, **SERVING_DEFAULTS, **extra)


@functools.cache
def planner_settings(standalone: bool) -> type[PlannerSettings]:
    """The planner's settings record as ``nightjar planner`` (standalone) or ``up`` builds it."""
    return with_defaults(PlannerSettings, redis_url=STANDALONE_REDIS) if standalone else PlannerSettings


class LogSettings(EnvSettings):
    log_level: Literal["debug", "info", "warning", "error"] = Field(default="info", description="log level")
    log_format: Literal["plain", "json"] = Field(
        default="plain", description="plain lines or one JSON object a line"
    )

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value


class UpSettings(EnvSettings):
    share_store: bool = Field(
        default=True,
        description="serve the embedded store on 127.0.0.1 to other processes (nightjar top finds it "
        "through a file under NIGHTJAR_CACHE)",
    )
    store_port: int = Field(default=0, ge=0, le=65535, description="port of the shared store; 0: a free one")


class SubmitSettings(EnvSettings):
    url: str = Field(
        default="http://127.0.0.1:8000", validation_alias="NIGHTJAR_URL", description="the gateway"
    )
    api_key: str | None = Field(
        default=None,
        validation_alias="NIGHTJAR_API_KEY",
        description="Bearer key for the gateway; none: no header",
    )
    max_tokens: int = Field(
        default=64,
        ge=1,
        validation_alias="NIGHTJAR_SUBMIT_MAX_TOKENS",
        description="tokens to generate at most",
    )
    temperature: float = Field(
        default=0.0,
        ge=0,
        validation_alias="NIGHTJAR_SUBMIT_TEMPERATURE",
        description="sampling temperature; 0: greedy",
    )
    seed: int | None = Field(
        default=None,
        validation_alias="NIGHTJAR_SUBMIT_SEED",
        description="sampling seed; none: the gateway picks one",
    )
    chat: bool = Field(
        default=False,
        validation_alias="NIGHTJAR_SUBMIT_CHAT",
        description="send the prompt as a chat message",
    )
