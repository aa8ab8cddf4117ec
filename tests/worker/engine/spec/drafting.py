"""A model drafter over a tiny checkpoint, and a bare sequence, for the drafter tests."""

from __future__ import annotations

from pathlib import Path

import torch

from shared.schemas import SamplingParams
from worker.engine.model_runner import ModelRunner
from worker.engine.sequence import Sequence
from worker.engine.spec.model_drafter import ModelDrafter
from worker.engine.weights import load_checkpoint


def make_drafter(path: Path, num_blocks: int = 128, max_tokens: int = 512) -> ModelDrafter:
    config, state = load_checkpoint(path)
    runner = ModelRunner(config, state, 4, torch.device("cpu"), torch.float32, num_blocks=num_blocks)
    return ModelDrafter(path.name, runner, max_tokens)


def seq(name: str, tokens: list[int], params: SamplingParams | None = None) -> Sequence:
    return Sequence(name, list(tokens), params or SamplingParams())
