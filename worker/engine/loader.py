"""``load_engine(model_dir, **config)``: checkpoint + tokenizer → a ready LLMEngine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from worker.engine.config import DEFAULT_KV_BYTES, EngineConfig
from worker.engine.engine import LLMEngine
from worker.engine.model_config import ModelConfig
from worker.engine.model_runner import ModelRunner
from worker.engine.weights import find_gguf, load_checkpoint

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def load_engine(model_dir: str | Path, gguf_file: str | None = None, **config: Any) -> LLMEngine:
    """Build the engine for a Llama-family checkpoint (safetensors, sharded, or GGUF).
    ``config`` takes the fields of ``EngineConfig``."""
    cfg = EngineConfig.from_kwargs(**config)
    path = Path(model_dir)
    gguf_file = gguf_file or find_gguf(path)
    model_config, state = load_checkpoint(path, gguf_file)
    runner = ModelRunner(
        model_config,
        state,
        cfg.block_size,
        cfg.torch_device(),
        cfg.torch_dtype(),
        num_blocks=cfg.num_blocks,
        memory_budget_bytes=cfg.memory_budget_bytes,
        default_kv_bytes=DEFAULT_KV_BYTES,
    )
    del state
    tokenizer = load_tokenizer(path, gguf_file)
    engine = LLMEngine(runner, cfg, eos_token_ids(path, model_config, tokenizer))
    engine.tokenizer = tokenizer
    return engine


def load_tokenizer(path: Path, gguf_file: str | None = None) -> Any:
    """The checkpoint's tokenizer, or None when it ships without one."""
    from transformers import AutoTokenizer

    if gguf_file is not None:
        return AutoTokenizer.from_pretrained(str(path), gguf_file=gguf_file)
    if not any((path / name).exists() for name in _TOKENIZER_FILES):
        return None
    return AutoTokenizer.from_pretrained(str(path))


def eos_token_ids(path: Path, config: ModelConfig, tokenizer: Any) -> frozenset[int]:
    """Every id that ends generation: the tokenizer's EOS, generation_config.json's
    ``eos_token_id`` (what transformers' generate stops on) and the model config's."""
    ids = set(config.eos_token_ids)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen = path / "generation_config.json"
    if gen.exists():
        with open(gen, encoding="utf-8") as f:
            value = json.load(f).get("eos_token_id")
        ids.update(value if isinstance(value, list) else [] if value is None else [value])
    return frozenset(int(i) for i in ids)
