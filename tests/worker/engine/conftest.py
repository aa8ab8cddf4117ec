"""Session fixtures: the tiny checkpoints of ``tiny.py``, saved once; and every engine step
of every test here is followed by ``LLMEngine.check_integrity`` (block books balance)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.worker.engine.drafters import build_drafters
from tests.worker.engine.tiny import save_tiny, tiny_configs
from worker.engine.api import StepResult
from worker.engine.engine import LLMEngine

# The tiny models' matrices are far too small to split across threads, and on the shared
# 2-core machine a second OpenMP thread mostly spins: one thread runs these tests ~5x faster.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny_models")
    return {name: save_tiny(cfg, root / name) for name, cfg in tiny_configs().items()}


@pytest.fixture(scope="session")
def llama_dir(tiny_models: dict[str, Path]) -> Path:
    return tiny_models["llama"]


@pytest.fixture(scope="session")
def spec_models(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The "llama" target and its drafters (see ``drafters.py``)."""
    return build_drafters(tiny_models["llama"], tmp_path_factory.mktemp("drafters"))


@pytest.fixture(scope="session")
def drafter_dirs(spec_models: dict[str, Path]) -> list[Path]:
    return [spec_models[n] for n in ("copy", "layer0", "rand-a", "rand-b")]


@pytest.fixture(autouse=True)
def checked_steps(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Check the engine's integrity after every step (mini-sglang does the same); yields a
    one-element list counting the steps checked."""
    step, checked = LLMEngine.step, [0]

    def step_and_check(self: LLMEngine) -> StepResult:
        result = step(self)
        self.check_integrity()
        checked[0] += 1
        return result

    monkeypatch.setattr(LLMEngine, "step", step_and_check)
    yield checked
