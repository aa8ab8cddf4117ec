"""A Redis outage is logged once as it starts and once as it ends, per gateway process, not
once per reader per try (gateway/outage.py ``OutageLog``)."""

from __future__ import annotations

import logging

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway import outage as outage_mod
from gateway.outage import Outage, OutageStats

pytestmark = pytest.mark.anyio


def _lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "nightjar.gateway" and r.levelno == level]


async def test_many_readers_in_one_outage_log_its_start_and_end_once(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(outage_mod, "OUTAGE_LOG", getattr(outage_mod, "OutageLog", object)(), raising=False)
    caplog.set_level(logging.INFO, logger="nightjar.gateway")
    stats = OutageStats()
    readers = [Outage(30.0, f"job {i}", stats) for i in range(50)]
    down = RedisConnectionError("gone")
    for _ in range(3):  # every reader retries three times
        for o in readers:
            o.failed(down)
    assert len(_lines(caplog, logging.WARNING)) == 1 and "unreachable" in _lines(caplog, logging.WARNING)[0]
    for o in readers:
        o.recovered()
    ended = _lines(caplog, logging.INFO)
    assert len(ended) == 1 and "50 resumed" in ended[0], ended
    assert stats.waiting == 0 and stats.resumed == 50


async def test_readers_past_the_grace_period_log_it_once(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(outage_mod, "OUTAGE_LOG", getattr(outage_mod, "OutageLog", object)(), raising=False)
    caplog.set_level(logging.INFO, logger="nightjar.gateway")
    clock = [0.0]
    monkeypatch.setattr(outage_mod.anyio, "current_time", lambda: clock[0])
    readers = [Outage(5.0, f"job {i}") for i in range(20)]
    down = RedisConnectionError("gone")
    for o in readers:
        o.failed(down)
    clock[0] = 6.0  # past the grace period: each gives up at its next try
    for o in readers:
        with pytest.raises(RedisConnectionError):
            o.failed(down)
    warnings = _lines(caplog, logging.WARNING)
    assert len(warnings) == 2 and "grace period" in warnings[1], warnings  # its start, the first give-up
    ended = _lines(caplog, logging.INFO)
    assert len(ended) == 1 and "20 gave up" in ended[0], ended
