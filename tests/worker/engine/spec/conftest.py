"""Session fixtures of the speculative tests: the target's greedy references, the
small-vocabulary target and drafter, and a trained feature head."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import LlamaConfig

from tests.worker.engine.prompts import PROMPTS
from tests.worker.engine.spec.distribution import V
from tests.worker.engine.spec.feature_heads import trained_head
from tests.worker.engine.spec.references import NEW
from tests.worker.engine.tiny import COMMON, hf_greedy, hf_model, save_tiny


@pytest.fixture(scope="session")
def spec_references(spec_models: dict[str, Path]) -> list[list[int]]:
    hf = hf_model(spec_models["target"])
    return [hf_greedy(hf, p, NEW, stop_at_eos=False) for p in PROMPTS]


@pytest.fixture(scope="session")
def small_vocab(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("small_vocab")
    base = {**COMMON, "vocab_size": V, "initializer_range": 0.1}
    draft = {**base, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1}
    return {
        "target": save_tiny(LlamaConfig(**base), root / "target", seed=0),
        "draft": save_tiny(LlamaConfig(**draft), root / "draft", seed=5),
    }


@pytest.fixture(scope="session")
def head_dir(spec_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return trained_head(spec_models["target"], tmp_path_factory.mktemp("fd") / "fd-head", steps=60)
