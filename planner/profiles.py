"""The workers' startup cost profiles, as the planner reads them for its policies' prior.

Each worker publishes the profile it measured under its model's key (``keys.cost_profile``).
The planner looks at the models of the live workers (``keys.WORKERS``) and takes the most
recently measured of their profiles: decisions are global, so a planner serves one kind of
worker best, and the newest profile is the one of the pool as it is now (a worker measures
again after an offload changes its KV pool).
"""

from __future__ import annotations

import logging

import redis.asyncio as aioredis
from pydantic import ValidationError

from shared import codec, keys
from shared.control import WorkerInfo
from shared.profile import CostProfile

log = logging.getLogger(__name__)


async def live_models(r: aioredis.Redis) -> list[str]:
    """The models served by the workers heard from recently, sorted."""
    models = set()
    for raw in (await r.hgetall(keys.WORKERS)).values():
        try:
            info = codec.decode_as(raw if isinstance(raw, bytes) else raw.encode(), WorkerInfo)
        except codec.CodecError:
            continue
        if info.is_alive():
            models.add(info.model)
    return sorted(models)


async def newest_profile(r: aioredis.Redis) -> CostProfile | None:
    """The most recently measured cost profile among the live workers' models (None: none)."""
    newest: CostProfile | None = None
    for model in await live_models(r):
        raw = await r.get(keys.cost_profile(model))
        if raw is None:
            continue
        try:
            profile = CostProfile.loads(raw)
        except (ValidationError, ValueError) as exc:
            log.error("ignoring the unreadable cost profile of %s: %s", model, exc)
            continue
        if newest is None or profile.measured_at > newest.measured_at:
            newest = profile
    return newest


def same(a: CostProfile | None, b: CostProfile | None) -> bool:
    """The same measurement (model, worker and time)."""
    if a is None or b is None:
        return a is b
    return (a.model, a.worker_id, a.measured_at) == (b.model, b.worker_id, b.measured_at)
