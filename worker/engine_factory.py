"""The one place where the worker chooses its engine: the paged, speculating ``LLMEngine``."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from worker.engine.api import Engine

log = logging.getLogger(__name__)


def create_engine(
    model_dir: str | Path, drafters: Iterable[str | Path] = (), ngram: bool = True, **cfg: Any
) -> Engine:
    """The engine for the model in ``model_dir`` with its drafters (model directories that
    share its tokenizer; ``ngram`` adds prompt lookup); ``cfg`` holds ``EngineConfig`` options."""
    from worker.engine.loader import load_engine  # torch: imported only when an engine is built

    engine = load_engine(model_dir, drafters=list(drafters), ngram=ngram, **cfg)
    pool = engine.spec.pool
    kinds = [f"{name} ({type(d).__name__})" for name, d in pool.drafters.items()] if pool else []
    log.info("engine for %s: drafters %s", Path(model_dir).name, ", ".join(kinds) or "none (no speculation)")
    return engine
