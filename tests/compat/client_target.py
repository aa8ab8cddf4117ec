"""What every client check of tests/compat/run_clients.py shares: the target, the schema and
the tool the structured-output and tool checks ask for."""

from __future__ import annotations

import json
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field


@dataclass(frozen=True)
class Target:
    base: str  # .../v1
    model: str
    model_dir: Path | None  # the served model's directory (tokenizer, reference forward)


class Pet(BaseModel):
    """A pet (the structured-output checks' schema: it ends in a few tokens)."""

    kind: Literal["cat", "dog", "bird"]
    legs: int = Field(ge=0, le=8)


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
            "required": ["city"],
            "additionalProperties": False,  # else the tiny model's greedy JSON may add keys until max_tokens
        },
    },
}


def model_id(base_url: str) -> str:
    with urllib.request.urlopen(base_url.rstrip("/") + "/models", timeout=10) as resp:
        return str(json.load(resp)["data"][0]["id"])
