"""Typed settings read from ``NIGHTJAR_*`` environment variables (pydantic-settings).

Every settings record of the services (``gateway/settings.py``, ``worker/settings.py``,
``planner/settings.py``) and of the command line derives from ``EnvSettings``: a field
``max_queue`` reads ``NIGHTJAR_MAX_QUEUE`` (or the name its ``validation_alias`` gives),
typed and validated by pydantic, once, when the record is built; keyword arguments win over
the environment, the environment over the field's default. No module parses the environment
by hand. ``RuntimeSettings`` holds the process-wide knobs (the cache directory, the event
loop, the Redis pool size).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, Field
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

ENV_PREFIX = "NIGHTJAR_"
DEFAULT_MAX_CONNECTIONS = 10_000


def _split_commas(value: Any) -> Any:
    """``"a, b,"`` → ``("a", "b")``: a list in one environment variable, comma-separated."""
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    return value


# A tuple of strings that an environment variable gives comma-separated (not as JSON).
CommaList = Annotated[tuple[str, ...], NoDecode, BeforeValidator(_split_commas)]


class EnvSettings(BaseSettings):
    """The base of every settings record: ``NIGHTJAR_<FIELD>`` variables, unknown fields
    refused, fields settable by name even where an alias names their variable, and an
    empty variable treated as unset."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        extra="forbid",
        validate_by_name=True,
        validate_by_alias=True,
        env_ignore_empty=True,
    )


def env_name(cls: type[BaseSettings], field: str) -> str:
    """The environment variable ``field`` of ``cls`` reads."""
    info: FieldInfo = cls.model_fields[field]
    alias = info.validation_alias
    if isinstance(alias, str):
        return alias
    prefix = str(cls.model_config.get("env_prefix", ""))
    return (prefix + field).upper()


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "nightjar"


class RuntimeSettings(EnvSettings):
    """Process-wide knobs, read where they are used (each one in one place)."""

    cache: Path = Field(
        default_factory=default_cache_dir,
        description="directory of what Nightjar caches between runs: cost profiles, the embedded "
        "store's address (~/.cache/nightjar)",
    )
    uvloop: bool = Field(default=True, description="run the services on uvloop where it is installed")
    redis_url: str = Field(
        default="memory://", description="the Redis a client connects to when given none (shared.connection)"
    )
    redis_max_connections: int = Field(
        default=DEFAULT_MAX_CONNECTIONS,
        ge=1,
        description="connections a client's pool opens at most (every open event stream holds one in a "
        "blocking read); past it a caller waits for a free one",
    )
