"""Reads the telemetry and decision streams while a configuration runs.

Read as it goes, with XREAD from a cursor, because the telemetry stream is trimmed
(``MAXLEN ~``): a read after a long run would find its beginning gone. Nothing is consumed
through the planner's group, so the planner sees exactly what it would see without the
benchmark.
"""

from __future__ import annotations

import logging
from typing import Any

import anyio
import redis.asyncio as aioredis

from shared import codec, keys
from shared.control import Decision, Telemetry
from shared.streams import id_str

log = logging.getLogger(__name__)


class StreamCollector:
    def __init__(self, r: aioredis.Redis, block_ms: int = 200) -> None:
        self.r = r
        self.block_ms = block_ms
        self.telemetry: list[Telemetry] = []
        self.decisions: list[Decision] = []
        self._cursors = {keys.TELEMETRY_STREAM: "0-0", keys.DECISIONS_STREAM: "0-0"}

    async def poll(self, block_ms: int | None = None) -> int:
        """Read what is new on both streams; returns how many messages were taken."""
        streams: dict[Any, Any] = dict(self._cursors)
        resp: Any = await self.r.xread(streams, count=2000, block=block_ms)
        got = 0
        # RESP3 replies map stream -> entries; RESP2 replies are [stream, entries] pairs.
        groups = list(resp.items()) if isinstance(resp, dict) else list(resp or [])
        for stream, stream_entries in groups:
            name = id_str(stream)
            for entry_id, fields in stream_entries:
                self._cursors[name] = id_str(entry_id)
                if fields is None:
                    continue
                try:
                    msg = codec.from_entry(fields)
                except codec.CodecError as exc:
                    log.warning("skipping an unreadable %s entry: %s", name, exc)
                    continue
                if isinstance(msg, Telemetry):
                    self.telemetry.append(msg)
                elif isinstance(msg, Decision):
                    self.decisions.append(msg)
                got += 1
        return got

    async def run(self, stop: anyio.Event) -> None:
        """Poll until ``stop`` is set, then take what is left."""
        while not stop.is_set():
            await self.poll(self.block_ms)
        while await self.poll(None):
            pass
