"""The one place where the worker chooses its engine: the paged, speculating ``LLMEngine``."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from worker.engine.api import Engine


def create_engine(
    model_dir: str | Path, drafters: Iterable[str | Path] = (), ngram: bool = True, **cfg: Any
) -> Engine:
    """The engine for the model in ``model_dir`` with its drafters (model directories that
    share its tokenizer; ``ngram`` adds prompt lookup); ``cfg`` holds ``EngineConfig`` options."""
    from worker.engine.loader import load_engine  # torch: imported only when an engine is built

    return load_engine(model_dir, drafters=list(drafters), ngram=ngram, **cfg)
