"""The startup cost profile, cached on disk so a worker is ready in seconds on its next start.

Measuring the profile takes up to its budget (60 s on SmolLM2-135M) on every start. What it
measures depends only on what is timed and where, so a profile is kept per

- model: the target's and each drafter's directory name, ``config.json`` digest and weight
  files (name, size, modification time: a re-export or retraining changes them; a ``.gguf``
  given as the model is its own weight file);
- drafters and engine: the drafter names the engine offers, the n-gram drafter, the engine
  options (``EngineConfig``), the KV pool it got and the precision it serves (``weights``:
  a directory's GGUF blocks or ``--dtype fp32``);
- machine: architecture, CPU model, cores, torch threads and version, device;
- code: a digest of the source that measures and of what it measures — ``worker/profiling.py``,
  ``worker/cost_profile.py``, ``shared/profile.py``, this file, the engine
  (``worker/engine/``) and the kernels (``nj_kernels/``) — so a changed profiler or engine
  invalidates every cached profile;
- what the pass measures (``ProfileSettings``: batch sizes, γ, rounds, budget),

under ``<NIGHTJAR_CACHE>/profiles/`` (``~/.cache/nightjar``), one JSON file per key holding
the key itself and the profile: a file is used only when its key equals this worker's in
full. ``worker/cost_profile.py`` loads it at start and measures again when idle (the
refresh), writing the new one back.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from shared.profile import CostProfile
from worker.profiling import ProfileSettings

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent
# The source a profile's numbers depend on: the measuring code and what it measures.
CODE_FILES = ("worker/profiling.py", "worker/cost_profile.py", "worker/profile_cache.py", "shared/profile.py")
CODE_DIRS = ("worker/engine", "nj_kernels")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt")


class ProfileKey(BaseModel):
    """Everything a cached profile is valid for (equal keys: the same measurement)."""

    models: list[dict[str, Any]]  # the target's identity first, then each drafter's
    drafters: list[str]  # the names the engine offers ("ngram" included when on)
    engine: dict[str, Any]  # EngineConfig options, as text, and the KV blocks
    machine: dict[str, Any]
    code: str  # digest of CODE_FILES and CODE_DIRS
    shape: dict[str, Any]  # ProfileSettings, without ``enabled``

    def digest(self) -> str:
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:20]


def model_identity(path: str | Path) -> dict[str, Any]:
    """A model directory as the profile sees it: name, config digest, weight files."""
    p = Path(path)
    config = p / "config.json"
    digest = hashlib.sha256(config.read_bytes()).hexdigest()[:16] if config.is_file() else ""
    weights = []
    files = sorted(p.iterdir()) if p.is_dir() else [p] if p.is_file() else []  # a .gguf given as the model
    for f in files:
        if f.suffix in WEIGHT_SUFFIXES and f.is_file():
            st = f.stat()
            weights.append([f.name, st.st_size, st.st_mtime_ns])
    return {"name": p.name, "config": digest, "weights": weights}


def code_digest(root: Path = ROOT) -> str:
    h = hashlib.sha256()
    files = [root / f for f in CODE_FILES]
    for d in CODE_DIRS:
        files += sorted(
            f
            for f in (root / d).rglob("*")
            if f.suffix in (".py", ".c", ".h") and "__pycache__" not in f.parts
        )
    for f in files:
        if f.is_file():
            h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:20]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "Hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def machine_identity(device: str) -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "arch": platform.machine(),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "device": device,
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


def engine_identity(engine: Any) -> dict[str, Any]:
    """The engine options that change what a step costs, and its KV pool."""
    config = getattr(engine, "config", None)
    out: dict[str, Any] = {}
    if config is not None:
        out = {f.name: repr(getattr(config, f.name)) for f in fields(config)}
    out["num_blocks"] = getattr(getattr(engine, "blocks", None), "num_blocks", None)
    out["weights"] = getattr(engine, "weights", "")  # the precision served (Q4_1 blocks cost otherwise)
    return out


def profile_key(
    engine: Any, model_dir: str | Path, drafter_dirs: list[str], shape: ProfileSettings
) -> ProfileKey:
    device = "cpu"
    config = getattr(engine, "config", None)
    if config is not None and hasattr(config, "torch_device"):
        device = str(config.torch_device())
    dims = {k: v for k, v in asdict(shape).items() if k != "enabled"}
    return ProfileKey(
        models=[model_identity(model_dir), *(model_identity(d) for d in drafter_dirs)],
        drafters=list(getattr(engine, "drafter_names", [])),
        engine=engine_identity(engine),
        machine=machine_identity(device),
        code=code_digest(),
        shape=dims,
    )


class ProfileCache:
    """One key's file under ``folder``: ``load`` the profile measured for it, ``store`` one."""

    def __init__(self, folder: Path, key: ProfileKey) -> None:
        self.key = key
        name = str(key.models[0].get("name") or "model")
        self.path = folder / f"{name}-{key.digest()}.json"

    def load(self) -> CostProfile | None:
        """The cached profile of this key (None: none, or unreadable, or another key's)."""
        try:
            raw = json.loads(self.path.read_text())
            if ProfileKey.model_validate(raw["key"]) != self.key:
                return None
            return CostProfile.model_validate(raw["profile"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, ValidationError) as exc:
            log.warning("ignoring the unreadable cached cost profile %s: %s", self.path, exc)
            return None

    def store(self, profile: CostProfile) -> None:
        """Write it (atomically: a reader sees the old file or the new one); a write that
        fails is logged, never raised: the cache only saves time."""
        body = json.dumps({"key": self.key.model_dump(), "profile": profile.model_dump()})
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(body)
            tmp.replace(self.path)
        except OSError as exc:
            log.warning("could not cache the cost profile at %s: %s", self.path, exc)
            tmp.unlink(missing_ok=True)
