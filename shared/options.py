"""``key=value`` command-line options (``--engine-opt``, ``--set``), parsed one way for every
CLI: the nightjar commands and the benchmarks import this, not each other."""

from __future__ import annotations

import json
from typing import Any


def pairs(items: list[str] | None, flag: str) -> dict[str, str]:
    """``["a=1", "b=x"]`` → ``{"a": "1", "b": "x"}``; ValueError names ``flag`` on a bad item."""
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{flag} takes key=value, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def typed(value: str) -> Any:
    """A JSON value when the text is one (``4``, ``true``, ``[1, 2]``), else the text itself."""
    try:
        return json.loads(value)
    except ValueError:
        return value


def typed_pairs(items: list[str] | None, flag: str) -> dict[str, Any]:
    """``pairs`` with each value through ``typed``: ``num_blocks=64`` → ``{"num_blocks": 64}``."""
    return {k: typed(v) for k, v in pairs(items, flag).items()}
