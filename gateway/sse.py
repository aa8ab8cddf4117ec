"""Server-sent events framing."""

from __future__ import annotations

import json
from typing import Any

from fastapi.responses import StreamingResponse

KEEPALIVE = ": keep-alive\n\n"
DONE = "data: [DONE]\n\n"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def data(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def event(event_id: str, kind: str, obj: Any) -> str:
    return f"id: {event_id}\nevent: {kind}\ndata: {json.dumps(obj, ensure_ascii=False)}\n\n"


def response(body: Any) -> StreamingResponse:
    return StreamingResponse(body, media_type="text/event-stream", headers=HEADERS)
