"""Fixtures of the worker tests: a tiny model, an engine and a clean embedded Redis."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from shared.connection import connect, reset_fake_server
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


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def r() -> AsyncIterator[aioredis.Redis]:
    reset_fake_server()
    client = connect("memory://")
    yield client
    await client.aclose()
