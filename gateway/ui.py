"""The chat page (``GET /`` and ``/ui``): plain HTML, CSS and JavaScript in ``gateway/ui/``,
packaged with the gateway, no build step and nothing fetched from elsewhere.

The page talks to the gateway's own routes: ``/v1/models``, ``/v1/chat/completions`` with
``stream_options.include_spec`` (each chunk's ``nightjar`` field marks its tokens as
accepted drafts or the target's own, with each step's drafter and γ: docs/api.md), and
``GET /ui/api/top``, the planner's live decisions per batch size and each worker's last
steps as JSON (``shared.overview``: what ``nightjar top`` shows). With API keys configured,
``/ui/api`` is guarded like ``/v1`` (gateway/auth.py); the page asks for the key.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, Response

from gateway.errors import APIError
from shared import overview
from shared.errors import ErrorCode

router = APIRouter()
ASSETS = {"chat.js": "text/javascript; charset=utf-8", "style.css": "text/css; charset=utf-8"}
# The page is the gateway's own: no script, style or connection from anywhere else.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"}


@cache
def _asset(name: str) -> bytes:
    return (resources.files("gateway") / "ui" / name).read_bytes()


@router.get("/", include_in_schema=False)
@router.get("/ui", include_in_schema=False)
async def page() -> HTMLResponse:
    return HTMLResponse(_asset("index.html"), headers=HEADERS)


@router.get("/ui/{name}", include_in_schema=False)
async def asset(name: str) -> Response:
    kind = ASSETS.get(name)
    if kind is None:
        raise APIError.of(ErrorCode.NOT_FOUND, f"no such file: /ui/{name[:100]}")
    return Response(_asset(name), media_type=kind, headers=HEADERS)


@router.get("/ui/api/top")
async def top(request: Request, tail: int = Query(default=500, ge=1, le=5000)) -> dict[str, Any]:
    """The planner's decisions and the workers' last steps (``shared.overview.as_json``)."""
    snap = await overview.snapshot(request.app.state.store.r, tail)
    return overview.as_json(snap)
