"""The one place where the worker chooses its engine: the paged, speculating ``LLMEngine``, or
(``--engine-opt engine=synthetic``) the model-free ``SyntheticEngine`` that emits tokens at a
cost profile's rate, for measuring the control plane (benchmarks/control_plane.py)."""

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
    share its tokenizer; ``ngram`` adds prompt lookup); ``cfg`` holds ``EngineConfig`` options
    (with ``engine="synthetic"``: ``SyntheticEngine.from_options``'s instead; the model
    directory then gives only the tokenizer)."""
    kind = cfg.pop("engine", "llm")
    if kind == "synthetic":
        from worker.engine.synthetic import SyntheticEngine

        synthetic = SyntheticEngine.from_options(**cfg)
        log.info("synthetic engine (no model): %s", synthetic.profile.source)
        return synthetic
    if kind != "llm":
        raise ValueError(f"unknown engine {kind!r}: llm or synthetic")
    from worker.engine.loader import load_engine  # torch: imported only when an engine is built

    engine = load_engine(model_dir, drafters=list(drafters), ngram=ngram, **cfg)
    pool = engine.spec.pool
    kinds = [f"{name} ({type(d).__name__})" for name, d in pool.drafters.items()] if pool else []
    log.info("engine for %s: drafters %s", Path(model_dir).name, ", ".join(kinds) or "none (no speculation)")
    return engine
