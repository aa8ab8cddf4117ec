"""What the command lines share: option values from NIGHTJAR_* variables, key=value pairs,
the bundled models and their drafters, and the one usage error. ``nightjar.cli`` (the
parser), ``nightjar.commands`` (what each subcommand does) and ``nightjar bench`` all import
from here, never from each other, so the command-line modules form no import circle.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

MODELS_DIR = Path(__file__).resolve().parent.parent / "models"
BUNDLED_MODEL = MODELS_DIR / "nj-target"
# The drafters trained for each bundled target: loaded with it by default when they are there.
BUNDLED_DRAFTERS = {
    "nj-target": ("nj-draft-prose", "nj-draft-code"),
    # The feature heads first: the first model drafter is the default one.
    "smollm2-135m-instruct": ("smol-eagle-chat", "smol-eagle-code", "smol-draft-chat", "smol-draft-code"),
}


# --dtype values and the engine's dtype each stands for (None: auto, the weights as stored).
DTYPES = {"auto": None, "fp32": "float32", "float32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16",
          "fp16": "float16", "float16": "float16"}  # fmt: skip
DTYPE_CHOICES = tuple(DTYPES)


class UsageError(Exception):
    """Bad input from the command line: reported in one line, exit code 2."""


def env(name: str, default: Any = None) -> Any:
    return os.environ.get(f"NIGHTJAR_{name}", default)


def pairs(items: list[str] | None, what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"{what} takes key=value, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def typed(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return value


def model_dir(arg: str | None) -> str:
    """The model to serve: a Hugging Face directory (config.json), a directory holding a
    .gguf file, or a .gguf file."""
    path = Path(arg) if arg else BUNDLED_MODEL
    if path.is_file() and path.suffix == ".gguf":
        return str(path)
    if not (path / "config.json").is_file() and not any(path.glob("*.gguf")):
        hint = "pass --model DIR" if not arg else "a Hugging Face model directory has config.json, or a .gguf"
        raise UsageError(f"no model at {path} ({hint})")
    return str(path)


def drafter_dirs(model_dir: str, given: list[str] | None) -> list[str]:
    """The drafters to load: ``--drafter`` values (or NIGHTJAR_DRAFTERS, comma-separated;
    "none": no model drafter), else the bundled drafters of a bundled target that exist."""
    listed = env("DRAFTERS")
    given = given or ([d.strip() for d in listed.split(",") if d.strip()] if listed else None)
    if given:
        if [g.lower() for g in given] == ["none"]:
            return []
        for d in given:
            if not (Path(d) / "config.json").is_file():
                raise UsageError(f"no drafter model at {d} (a Hugging Face model directory has config.json)")
        return list(given)
    path = Path(model_dir).resolve()
    if path.parent != MODELS_DIR.resolve():
        return []
    names = BUNDLED_DRAFTERS.get(path.name, ())
    return [str(MODELS_DIR / n) for n in names if (MODELS_DIR / n / "config.json").is_file()]


def api_keys(given: list[str] | None) -> tuple[str, ...]:
    """``--api-key`` values, else NIGHTJAR_API_KEYS (comma-separated)."""
    if given:
        return tuple(k.strip() for k in given if k.strip())
    listed = env("API_KEYS", "")
    return tuple(k.strip() for k in str(listed).split(",") if k.strip())


def engine_options(items: list[str] | None, dtype: str = "auto") -> dict[str, Any]:
    """``--engine-opt key=value`` (repeatable) as keyword options, values read as JSON when
    they parse (numbers, booleans, lists), else kept as text; ``--dtype`` (not auto) as the
    engine's ``dtype``."""
    opts = {k: typed(v) for k, v in pairs(items, "--engine-opt").items()}
    if dtype not in DTYPES:
        raise UsageError(f"--dtype takes one of {', '.join(DTYPES)}, got {dtype!r}")
    chosen = DTYPES[dtype]
    if chosen is not None:
        if opts.get("dtype", chosen) != chosen:
            raise UsageError(f"--dtype {dtype} and --engine-opt dtype={opts['dtype']} disagree")
        opts["dtype"] = chosen
    return opts
