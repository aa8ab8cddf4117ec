"""Server-sent events framing."""

from __future__ import annotations

import json
from typing import Any

import anyio
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

KEEPALIVE = ": keep-alive\n\n"
DONE = "data: [DONE]\n\n"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def data(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def event(event_id: str, kind: str, obj: Any) -> str:
    return f"id: {event_id}\nevent: {kind}\ndata: {json.dumps(obj, ensure_ascii=False)}\n\n"


class ClosingStreamingResponse(StreamingResponse):
    """Closes its body generator however the response ends (a client that left, a send
    that timed out), so the generator's cleanup — cancelling an abandoned job — runs now,
    not whenever the garbage collector finds it."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                with anyio.CancelScope(shield=True):
                    await aclose()


def response(body: Any) -> StreamingResponse:
    return ClosingStreamingResponse(body, media_type="text/event-stream", headers=HEADERS)
