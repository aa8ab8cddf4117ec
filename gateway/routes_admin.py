"""Operator routes, behind a bearer token (NIGHTJAR_ADMIN_TOKEN)."""

from __future__ import annotations

import hmac
from typing import Any

from fastapi import APIRouter, Header, Request
from pydantic import BaseModel, ConfigDict, Field

from gateway.errors import APIError
from shared import codec, keys
from shared.schemas import PolicyCommand

router = APIRouter()


class PolicyBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    policy: str = Field(min_length=1)
    params: dict[str, Any] = Field(default_factory=dict)


def _authorize(request: Request, authorization: str | None) -> None:
    token: str | None = request.app.state.settings.admin_token
    if not token:
        raise APIError(503, "admin routes are disabled: set NIGHTJAR_ADMIN_TOKEN", code="admin_disabled")
    if not authorization or not authorization.lower().startswith("bearer "):
        raise APIError(401, "missing bearer token", code="unauthorized")
    if not hmac.compare_digest(authorization[7:].strip().encode(), token.encode()):
        raise APIError(403, "wrong admin token", code="forbidden")


@router.post("/admin/policy", status_code=202)
async def set_policy(
    body: PolicyBody, request: Request, authorization: str | None = Header(default=None)
) -> dict[str, Any]:
    """Ask the planner to swap its policy; it validates the request and records the outcome
    (or the error) in the note of the next decision."""
    _authorize(request, authorization)
    cmd = PolicyCommand(policy=body.policy, params=body.params, requested_by="admin api")
    entry_id = await request.app.state.store.r.xadd(keys.PLANNER_CONTROL_STREAM, codec.entry(cmd))
    return {
        "accepted": True,
        "policy": body.policy,
        "id": entry_id.decode() if isinstance(entry_id, bytes) else entry_id,
    }
