"""The one place where the worker chooses its engine.

Swapping in the paged continuous-batching engine is a one-line change here:
``return load_engine(model_dir, **cfg)`` from ``worker.engine``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from worker.engine.api import Engine


def create_engine(model_dir: str | Path, **cfg: Any) -> Engine:
    """The engine for the model in ``model_dir``; ``cfg`` holds engine options."""
    from worker.engine.hf_engine import HFEngine

    return HFEngine(model_dir, **cfg)
