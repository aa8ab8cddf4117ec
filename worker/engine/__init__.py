"""The inference engine: scheduler, paged KV cache, model runner, speculation."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterable
    from pathlib import Path

    from worker.engine.engine import LLMEngine


def load_engine(
    model_dir: str | Path,
    gguf_file: str | None = None,
    drafters: Iterable[str | Path] = (),
    ngram: bool = True,
    **config: Any,
) -> LLMEngine:
    """Load a checkpoint and its drafters into an ``LLMEngine`` (see ``worker.engine.loader``).
    Imported lazily so that ``worker.engine.api`` stays free of torch for the service's tests."""
    from worker.engine.loader import load_engine as _load

    return _load(model_dir, gguf_file, drafters, ngram, **config)
