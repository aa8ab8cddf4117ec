"""``GET /v1/jobs``: an owner's jobs, newest first, a page at a time.

Each submit adds the job to its owner's sorted set (``keys.owner_jobs``, scored by submit
time, trimmed to the record TTL). A page is read from the newest, or from just after the
``after`` job id (its current rank, so jobs submitted meanwhile do not shift the page);
``status`` filters as the page is read, so a page may hold fewer than ``limit`` jobs while
``has_more`` is true.
"""

from __future__ import annotations

from typing import Any

from gateway.errors import APIError
from gateway.ids import valid_job_id
from gateway.store import JobStore
from shared import keys

SCAN_BATCH = 100  # ids read per round while filtering by status
MAX_SCANNED = 2_000  # ids examined per page at most (a rare status stops the page early)


async def jobs_page(
    store: JobStore, owner: str, status: str | None, limit: int, after: str | None
) -> dict[str, Any]:
    key = keys.owner_jobs(owner)
    start = 0
    if after is not None:
        rank = await store.r.zrevrank(key, after) if valid_job_id(after) else None
        if rank is None:
            return {"object": "list", "data": [], "first_id": None, "last_id": None, "has_more": False}
        start = int(rank) + 1  # type: ignore[arg-type]
    data: list[dict[str, Any]] = []
    scanned = 0
    cursor: str | None = None  # the last id examined: where the next page starts
    more = False
    while len(data) < limit and scanned < MAX_SCANNED:
        ids = await store.r.zrevrange(key, start, start + SCAN_BATCH - 1)
        if not ids:
            break
        for raw in ids:
            job_id = raw.decode() if isinstance(raw, bytes) else str(raw)
            scanned += 1
            start += 1
            cursor = job_id
            try:
                info = await store.info(job_id, owner)
            except APIError:  # expired since it was listed: not a job any more
                continue
            if status is None or info["status"] == status:
                data.append(info)
                if len(data) == limit:
                    break
    if cursor is not None:
        more = start < int(await store.r.zcard(key))
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": cursor if more else (data[-1]["id"] if data else None),
        "has_more": more,
    }
