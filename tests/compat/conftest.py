"""Compatibility tests: clients no one here wrote, against the real gateway (uvicorn on a
free loopback port) with an embedded worker and planner serving a tiny model."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tiny_models import build_llama


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_llama(tmp_path_factory.mktemp("compat-models") / "tiny-llama")
