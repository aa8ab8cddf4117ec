"""Following the cancel broadcast: a job cancelled at the gateway stops on the worker running it.

The gateway sets the job's cancel flag (the start script reads it) and broadcasts a
``CancelRequest`` on the model's cancel stream (``keys.cancel_stream``). ``CancelFollower``
reads that stream from where it stood when the follower first read it (older cancels were
for jobs the start script stops): a job held here is marked cancelled and its engine request
aborted; any other job id is remembered (``RunningJobs.cancel``), in case the job is between
its start script and being held. A malformed entry is logged and skipped.
"""

from __future__ import annotations

import logging

import redis.asyncio as aioredis

from shared import codec, keys
from shared.schemas import CancelRequest
from shared.streams import entries, last_id
from worker.engine.api import Engine
from worker.running import RunningJobs

log = logging.getLogger(__name__)


class CancelFollower:
    def __init__(
        self, r: aioredis.Redis, model: str, running: RunningJobs, engine: Engine, block_ms: int
    ) -> None:
        self.r, self.running, self.engine, self.block_ms = r, running, engine, block_ms
        self.stream = keys.cancel_stream(model)
        self.cursor: str | None = None  # the last entry read; None until the first read

    async def follow(self) -> None:
        """One read of the stream (blocking up to ``block_ms``), every cancel in it applied;
        the worker runs it in a loop (``keep_running``), which outlives a Redis outage."""
        if self.cursor is None:
            self.cursor = await last_id(self.r, self.stream)
        resp = await self.r.xread({self.stream: self.cursor}, count=100, block=self.block_ms)
        for entry_id, fields in entries(resp):
            self.cursor = entry_id.decode()
            try:
                msg = codec.from_entry(fields)
            except codec.CodecError as exc:
                log.error("skipping a malformed cancel entry: %s", exc)
                continue
            if isinstance(msg, CancelRequest) and (run := self.running.cancel(msg.job_id)) is not None:
                rid = run.job.request_id
                log.info(
                    "cancelling job %s (request %s)",
                    msg.job_id,
                    rid,
                    extra={"job_id": msg.job_id, "request_id": rid},
                )
                self.engine.abort_request(msg.job_id)
