"""``load_engine(model_dir, drafters=..., **config)``: checkpoints + tokenizer → a ready LLMEngine."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from worker.engine.config import DEFAULT_KV_BYTES, EngineConfig
from worker.engine.engine import LLMEngine
from worker.engine.gguf_file import GGUFFile
from worker.engine.gguf_weights import describe
from worker.engine.kv_cache import bytes_per_block
from worker.engine.model_config import ModelConfig
from worker.engine.model_runner import ModelRunner
from worker.engine.spec.drafter import Drafter
from worker.engine.spec.feature_drafter import FeatureDrafter
from worker.engine.spec.feature_model import FeatureRunner, is_feature_drafter, load_feature_runner
from worker.engine.spec.model_drafter import ModelDrafter
from worker.engine.spec.ngram import NgramDrafter
from worker.engine.weights import find_gguf, load_checkpoint, weights_for

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def load_engine(
    model_dir: str | Path,
    gguf_file: str | None = None,
    drafters: Iterable[str | Path] = (),
    ngram: bool = True,
    **config: Any,
) -> LLMEngine:
    """Build the engine for a Llama-family checkpoint (safetensors, sharded, or GGUF).

    A directory holding a GGUF file is served from the file's blocks on CPU (``weights_for``):
    unless ``dtype`` is given, then the safetensors beside it or the GGUF dequantised. The
    engine's ``weights`` says which (``Q4_1``, ``Q4_1+Q8_0``, ``float32``, ...).
    ``drafters``: checkpoint directories of model drafters (named after the directory), which
    must share the target's vocabulary; ``ngram`` adds the prompt-lookup drafter "ngram".
    ``config`` takes the fields of ``EngineConfig``. Every model (target and drafters) gets a
    KV pool of the same block count: the memory budget, less all weights, divided by the
    bytes one block costs in all pools together.
    """
    cfg = EngineConfig.from_kwargs(**config)
    path = Path(model_dir)
    if path.suffix == ".gguf" and path.is_file():  # a GGUF file given as the model
        path, gguf_file = path.parent, path.name
    device, dtype = cfg.torch_device(), cfg.torch_dtype()
    choice = weights_for(path, gguf_file, cfg.dtype, device.type)
    model_config, state = load_checkpoint(path, choice.gguf_file, native=choice.native)
    runner = ModelRunner(model_config, state, cfg.block_size, device, dtype, num_blocks=2)
    weights = (choice.native and describe(state)) or str(dtype).removeprefix("torch.")
    del state
    tokenizer = load_tokenizer(path, choice.gguf_file)
    models: list[tuple[str, ModelRunner]] = []
    for d in drafters:
        dpath = Path(d).resolve()
        if dpath.name in {n for n, _ in models} | {"ngram"}:
            raise ValueError(f"two drafters named {dpath.name!r}: drafters are named after their directory")
        if is_feature_drafter(dpath):  # reads the target's features; its vocabulary is the target's
            models.append((dpath.name, load_feature_runner(dpath, runner, cfg.block_size)))
            continue
        dgguf = find_gguf(dpath)
        dconfig, dstate = load_checkpoint(dpath, dgguf)
        check_vocab(model_config, tokenizer, dconfig, load_tokenizer(dpath, dgguf), dpath.name)
        models.append((dpath.name, ModelRunner(dconfig, dstate, cfg.block_size, device, dtype, num_blocks=2)))
    runners = [runner] + [r for _, r in models]
    num_blocks = cfg.num_blocks or shared_blocks(runners, cfg.block_size, cfg.memory_budget_bytes)
    for r in runners:
        r.cache.resize(num_blocks, [])
    pool: list[Drafter] = [
        FeatureDrafter(n, r, cfg.max_num_batched_tokens)
        if isinstance(r, FeatureRunner)
        else ModelDrafter(n, r, cfg.max_num_batched_tokens)
        for n, r in models
    ]
    if ngram:
        pool.append(NgramDrafter())
    engine = LLMEngine(runner, cfg, eos_token_ids(path, model_config, tokenizer), pool)
    engine.tokenizer = tokenizer
    engine.weights = weights
    return engine


def shared_blocks(runners: list[ModelRunner], block_size: int, budget_bytes: int | None) -> int:
    """KV blocks per model when every model's pool gets the same count from one budget."""
    weights = sum(r.weight_bytes for r in runners)
    budget = budget_bytes or weights + DEFAULT_KV_BYTES
    per_block = sum(bytes_per_block(r.config, block_size, r.dtype) for r in runners)
    if budget - weights < 2 * per_block:
        raise ValueError(
            f"memory budget {budget} B leaves {budget - weights} B after {weights} B of weights: "
            f"not even two KV blocks ({per_block} B each across {len(runners)} models)"
        )
    return (budget - weights) // per_block


def check_vocab(target: ModelConfig, target_tok: Any, draft: ModelConfig, draft_tok: Any, name: str) -> None:
    """Refuse a drafter whose token ids mean something else than the target's."""
    if draft.vocab_size != target.vocab_size:
        raise ValueError(
            f"drafter {name} has a vocabulary of {draft.vocab_size} tokens, the target {target.vocab_size}: "
            "a drafter must use the target's tokenizer"
        )
    if target_tok is not None and draft_tok is not None and target_tok.get_vocab() != draft_tok.get_vocab():
        raise ValueError(f"drafter {name}'s tokenizer maps tokens to other ids than the target's: refused")


def load_tokenizer(path: Path, gguf_file: str | None = None) -> Any:
    """The checkpoint's tokenizer (its files, else the GGUF's), or None when it has none."""
    from transformers import AutoTokenizer

    if any((path / name).exists() for name in _TOKENIZER_FILES):
        return AutoTokenizer.from_pretrained(str(path))  # beside a GGUF: the same tokenizer, saved
    if gguf_file is not None and "tokenizer.ggml.model" in GGUFFile(path / gguf_file).metadata:
        return AutoTokenizer.from_pretrained(str(path), gguf_file=gguf_file)
    return None


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
