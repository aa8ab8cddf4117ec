"""Fixtures of the worker tests: a tiny model, an engine and a clean embedded Redis."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tiny_models import build_llama
from worker.engine.api import Engine
from worker.engine_factory import create_engine
from worker.prompts import PromptEncoder


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_llama(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="session")
def prompts(model_dir: Path) -> PromptEncoder:
    return PromptEncoder.from_dir(model_dir)


@pytest.fixture
def engine(model_dir: Path) -> Engine:
    # A small KV pool: the default budget (1 GiB of KV) takes a while to allocate.
    return create_engine(model_dir, num_blocks=256)
