"""The runner: services on uvloop where installed, and the standard loop when told."""

from __future__ import annotations

import asyncio

import pytest

from nightjar.runner import serve, use_uvloop


class _Seen(Exception):
    """Ends the run (a service that raises stops them all) carrying the loop's module."""


def _loop_of_a_served_run() -> str:
    async def service() -> None:
        raise _Seen(type(asyncio.get_running_loop()).__module__)

    with pytest.raises(BaseException) as got:
        serve([service])
    seen = got.value
    while isinstance(seen, BaseExceptionGroup):  # (the task group wraps it)
        seen = seen.exceptions[0]
    assert isinstance(seen, _Seen)
    return str(seen.args[0])


def test_services_run_on_uvloop_unless_told_not_to(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NIGHTJAR_UVLOOP", raising=False)
    assert use_uvloop() and _loop_of_a_served_run().startswith("uvloop")
    monkeypatch.setenv("NIGHTJAR_UVLOOP", "0")
    assert not use_uvloop() and _loop_of_a_served_run().startswith("asyncio")
