"""Small helpers over Redis streams that more than one service needs."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

Entry = tuple[bytes, dict[bytes, bytes]]


def id_str(entry_id: Any) -> str:
    """A stream entry id as text (replies carry bytes)."""
    return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)


async def last_id(r: aioredis.Redis, stream: str) -> str:
    """The id of the stream's newest entry ("0-0" when empty): a cursor that misses nothing
    added after this call, unlike "$" re-issued between reads."""
    newest = await r.xrevrange(stream, count=1)
    return id_str(newest[0][0]) if newest else "0-0"


async def ensure_group(r: aioredis.Redis, stream: str, group: str, start: str = "0") -> None:
    """Create ``group`` on ``stream`` (and the stream) unless it exists.

    ``start="0"`` makes the group see entries added before it was created: the gateway may
    accept jobs before any worker has started.
    """
    try:
        await r.xgroup_create(stream, group, id=start, mkstream=True)
    except ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def entries(resp: Any) -> list[Entry]:
    """The (id, fields) pairs of an XREAD / XREADGROUP reply, over all its streams."""
    out: list[Entry] = []
    if not resp:
        return out
    # RESP3 replies map stream -> entries; RESP2 replies are [stream, entries] pairs.
    groups = list(resp.values()) if isinstance(resp, dict) else [se for _, se in resp]
    for stream_entries in groups:
        for entry_id, fields in stream_entries:
            if fields is not None:  # a pending entry deleted from the stream reads back as None
                out.append((entry_id, fields))
    return out


async def group_load(r: aioredis.Redis, stream: str, group: str, limit: int = 100_000) -> tuple[int, int]:
    """(pending, lag) of a consumer group: entries delivered but not acknowledged, and
    entries not yet delivered to any consumer.

    Both come from XINFO GROUPS. Redis reports ``lag`` as unknown after some deletions; the
    undelivered entries are then counted directly (up to ``limit``). A missing stream or
    group holds nothing.
    """
    try:
        groups = await r.xinfo_groups(stream)
    except ResponseError:  # no such stream yet
        return 0, 0
    for g in groups:
        name = g.get("name")
        if (name.decode() if isinstance(name, bytes) else name) != group:
            continue
        pending = int(g.get("pending") or 0)
        lag = g.get("lag")
        if lag is None:
            last = g.get("last-delivered-id", b"0-0")
            last_id = last.decode() if isinstance(last, bytes) else str(last)
            undelivered = await r.xrange(stream, min="(" + last_id, max="+", count=limit)
            lag = len(undelivered or [])
        return pending, int(lag)
    return 0, 0
