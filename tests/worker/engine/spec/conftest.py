"""Drafters for the tiny target of ``tests/worker/engine/tiny.py`` (the "llama" one).

Random tiny drafters almost never agree with a random target, so besides two of them
(different shapes) there is a copy of the target, which accepts everything, and the
target's first layer under its own embedding, norm and head, which accepts about one draft
in five: together they exercise acceptance, rejection and every mix in between.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from tests.worker.engine.tiny import save_tiny


def first_layers(target: Path, path: Path, layers: int) -> Path:
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    cfg = LlamaConfig(**{**model.config.to_dict(), "num_hidden_layers": layers})
    small = AutoModelForCausalLM.from_config(cfg)
    small.load_state_dict(model.state_dict(), strict=False)  # layers past `layers` are dropped
    small.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def spec_models(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    target = tiny_models["llama"]
    root = tmp_path_factory.mktemp("drafters")
    base = AutoModelForCausalLM.from_pretrained(target).config.to_dict()
    narrow = {**base, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1}
    other = {
        **base,
        "hidden_size": 48,
        "intermediate_size": 96,
        "num_attention_heads": 3,
        "num_key_value_heads": 1,
    }
    return {
        "target": target,
        "copy": Path(shutil.copytree(target, root / "copy")),
        "layer0": first_layers(target, root / "layer0", 1),
        "rand-a": save_tiny(LlamaConfig(**narrow), root / "rand-a", seed=1),
        "rand-b": save_tiny(LlamaConfig(**other), root / "rand-b", seed=2),
        "wide-vocab": save_tiny(LlamaConfig(**{**narrow, "vocab_size": 128}), root / "wide-vocab", seed=3),
    }


@pytest.fixture(scope="session")
def drafter_dirs(spec_models: dict[str, Path]) -> list[Path]:
    return [spec_models[n] for n in ("copy", "layer0", "rand-a", "rand-b")]
