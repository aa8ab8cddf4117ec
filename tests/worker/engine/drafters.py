"""Drafters for the tiny target of ``tiny.py`` (the "llama" one), built in a test session.

Random tiny drafters almost never agree with a random target, so besides two of them
(different shapes) there is a copy of the target, which accepts everything, and the
target's first layer under its own embedding, norm and head, which accepts about one draft
in five: together they exercise acceptance, rejection and every mix in between. A drafter
with a larger vocabulary is there to be refused.
"""

from __future__ import annotations

import shutil
from pathlib import Path

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


def build_drafters(target: Path, root: Path) -> dict[str, Path]:
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
