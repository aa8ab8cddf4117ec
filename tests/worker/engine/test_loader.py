"""load_engine with drafters: one memory budget for every model, vocabularies checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.tiny_models import build_llama
from worker.engine.kv_cache import bytes_per_block
from worker.engine.loader import load_engine


def test_one_budget_gives_every_pool_the_same_block_count(spec_models: dict[str, Path]) -> None:
    drafters = [spec_models["copy"], spec_models["layer0"]]
    budget = 3_000_000
    engine = load_engine(spec_models["target"], drafters=drafters, block_size=4, memory_budget_bytes=budget)
    runners = [engine.runner] + [d.runner for d in engine.spec.pool.models] if engine.spec.pool else []
    n = engine.runner.cache.num_blocks
    assert all(r.cache.num_blocks == n for r in runners)
    weights = sum(r.weight_bytes for r in runners)
    per_block = sum(bytes_per_block(r.config, 4, torch.float32) for r in runners)
    assert weights + n * per_block <= budget < weights + (n + 1) * per_block
    assert engine.drafter_names == ["copy", "layer0", "ngram"]
    assert load_engine(spec_models["target"], num_blocks=8, ngram=False).drafter_names == []


def test_a_drafter_with_another_vocabulary_is_refused(spec_models: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match="wide-vocab has a vocabulary of 128 tokens, the target 96"):
        load_engine(spec_models["target"], drafters=[spec_models["wide-vocab"]], num_blocks=8)
    with pytest.raises(ValueError, match="two drafters named 'copy'"):
        load_engine(spec_models["target"], drafters=[spec_models["copy"], spec_models["copy"]], num_blocks=8)


def test_a_drafter_whose_tokenizer_maps_other_ids_is_refused(tmp_path: Path) -> None:
    target = build_llama(tmp_path / "target")
    drafter = build_llama(tmp_path / "drafter", layers=1, hidden=32, seed=1)
    assert load_engine(target, drafters=[drafter], num_blocks=8).drafter_names == ["drafter", "ngram"]
    tok = json.loads((drafter / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[10:12]
    vocab[a], vocab[b] = vocab[b], vocab[a]  # same size, two ids swapped
    (drafter / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(ValueError, match="maps tokens to other ids than the target's"):
        load_engine(target, drafters=[drafter], num_blocks=8)
