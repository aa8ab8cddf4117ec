"""The batch band: /v1/batches jobs wait on their model's ``keys.batch_stream`` (no group
reads it) and never count as live load. A worker with free slots and nothing live to read
moves up to that many of them onto the model's job stream (``promote``), where they run like
any job (leases, retries, dead letters); the ids it moved are kept in
``keys.batch_inflight`` so the live admission does not count them (gateway/admission.py).
One script, so a live job that arrives meanwhile is never behind more than the free slots
a worker just filled: live requests always go first."""

from __future__ import annotations

import redis.asyncio as aioredis

from shared import keys

# KEYS: batch stream, job stream, inflight set (one hash tag). ARGV: group, count. Moves
# nothing while the group has undelivered (live) entries; returns how many it moved.
PROMOTE_LUA = """
local ok, groups = pcall(redis.call, 'XINFO', 'GROUPS', KEYS[2])
if ok then
  for _, g in ipairs(groups) do
    local t = {}
    for i = 1, #g, 2 do t[g[i]] = g[i + 1] end
    if t['name'] == ARGV[1] then
      local lag = t['lag']
      if not lag then
        lag = #redis.call('XRANGE', KEYS[2], '(' .. t['last-delivered-id'], '+', 'COUNT', 1)
      end
      if tonumber(lag) > 0 then return 0 end
    end
  end
end
for _, id in ipairs(redis.call('SMEMBERS', KEYS[3])) do
  if #redis.call('XRANGE', KEYS[2], id, id) == 0 then redis.call('SREM', KEYS[3], id) end
end
local got = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', tonumber(ARGV[2]))
for _, e in ipairs(got) do
  local id = redis.call('XADD', KEYS[2], '*', unpack(e[2]))
  redis.call('SADD', KEYS[3], id)
  redis.call('XDEL', KEYS[1], e[1])
end
return #got
"""


class BatchBand:
    """``promote`` for one model's streams (the script registered once)."""

    def __init__(self, r: aioredis.Redis, model: str) -> None:
        self._script = r.register_script(PROMOTE_LUA)
        self._keys = [keys.batch_stream(model), keys.jobs_stream(model), keys.batch_inflight(model)]

    async def promote(self, count: int) -> int:
        """Move up to ``count`` batch jobs onto the job stream, unless live jobs wait there."""
        if count <= 0:
            return 0
        return int(await self._script(keys=self._keys, args=[keys.JOBS_GROUP, count]))
