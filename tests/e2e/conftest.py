from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import pytest

from tests.tiny_models import build_llama


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_llama(tmp_path_factory.mktemp("e2e-models") / "tiny-llama")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def poll(
    check: Callable[[], Awaitable[object]], timeout_s: float, what: str, every_s: float = 0.05
) -> object:
    """Await ``check`` until it returns something truthy; fail after ``timeout_s``."""
    with anyio.move_on_after(timeout_s):
        while True:
            got = await check()
            if got:
                return got
            await anyio.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
