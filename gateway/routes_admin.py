"""Operator routes, behind a bearer token (NIGHTJAR_ADMIN_TOKEN): 401 without one, 403 with
a wrong one or while none is configured (``admin_disabled``, saying how to configure it)."""

from __future__ import annotations

import hmac
from typing import Any

from fastapi import APIRouter, Header, Request
from pydantic import BaseModel, ConfigDict, Field, field_validator

from gateway.errors import APIError
from shared import codec, keys, policy_params
from shared.control import PolicyCommand
from shared.errors import ErrorCode
from shared.schemas import valid_text

router = APIRouter()


MAX_PARAMS_DEPTH = 8  # nesting of lists / objects in a policy's params
MAX_PARAMS_NODES = 10_000  # values in all, at any depth
MAX_TEXT = 10_000  # characters of any one string (key or value)
NOT_CONFIGURED = "no admin token is configured (start the gateway with NIGHTJAR_ADMIN_TOKEN set)"


def check_params(value: Any) -> Any:
    """``value`` unchanged when it is small, shallow JSON that packs: bounded depth and size,
    64-bit integers, finite numbers, valid Unicode; else a ValueError saying what is wrong."""
    nodes = 0

    def walk(v: Any, depth: int) -> None:
        nonlocal nodes
        nodes += 1
        if nodes > MAX_PARAMS_NODES:
            raise ValueError(f"params have more than {MAX_PARAMS_NODES} values")
        if depth > MAX_PARAMS_DEPTH:
            raise ValueError(f"params are nested more than {MAX_PARAMS_DEPTH} deep")
        if isinstance(v, bool) or v is None:
            return
        if isinstance(v, int):
            if not -(2**63) <= v < 2**63:
                raise ValueError("params integers must fit in 64 bits")
        elif isinstance(v, float):
            if v != v or v in (float("inf"), float("-inf")):
                raise ValueError("params numbers must be finite")
        elif isinstance(v, str):
            if len(v) > MAX_TEXT:
                raise ValueError(f"params strings must be at most {MAX_TEXT} characters")
            valid_text(v)
        elif isinstance(v, list):
            for x in v:
                walk(x, depth + 1)
        elif isinstance(v, dict):
            for k, x in v.items():
                walk(k, depth + 1)
                walk(x, depth + 1)
        else:
            raise ValueError(f"params values must be JSON, not {type(v).__name__}")

    walk(value, 0)
    return value


class PolicyBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    policy: str = Field(min_length=1, max_length=200)
    params: dict[str, Any] = Field(default_factory=dict)

    @field_validator("policy")
    @classmethod
    def _policy_text(cls, v: str) -> str:
        return valid_text(v)

    @field_validator("params", mode="plain")
    @classmethod
    def _params(cls, v: Any) -> dict[str, Any]:
        if not isinstance(v, dict):
            raise ValueError("params must be an object")
        return check_params(v)


def _authorize(request: Request, authorization: str | None) -> None:
    """401 without a bearer token, 403 with a wrong one — or with any, while no admin token
    is configured (the route is closed: the message says how to open it). Never a 5xx: a
    missing setting is not the server failing."""
    token: str | None = request.app.state.settings.admin_token
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        hint = "" if token else f"; {NOT_CONFIGURED}"
        raise APIError.of(ErrorCode.UNAUTHORIZED, f"send 'Authorization: Bearer <admin token>'{hint}")
    if not token:
        raise APIError.of(ErrorCode.ADMIN_DISABLED, f"admin routes are closed: {NOT_CONFIGURED}")
    if not hmac.compare_digest(given.strip().encode("utf-8", "surrogateescape"), token.encode()):
        raise APIError.of(ErrorCode.FORBIDDEN, "wrong admin token")


@router.post("/admin/policy", status_code=202)
async def set_policy(
    body: PolicyBody, request: Request, authorization: str | None = Header(default=None)
) -> dict[str, Any]:
    """Ask the planner to swap its policy; it validates the request and records the outcome
    (or the error) in the note of the next decision. A policy or parameter the planner's
    catalogue (``keys.PLANNER_POLICIES``) refuses is a 400 here, naming the field."""
    _authorize(request, authorization)
    catalogue = await request.app.state.store.r.get(keys.PLANNER_POLICIES)
    bad = policy_params.problem(catalogue, body.policy, body.params)
    if bad is not None:  # what the planner would refuse: 400 naming the field, nothing sent
        raise APIError.of(ErrorCode.BAD_REQUEST, bad[1], param=bad[0])
    cmd = PolicyCommand(policy=body.policy, params=body.params, requested_by="admin api")
    entry_id = await request.app.state.store.r.xadd(
        keys.PLANNER_CONTROL_STREAM, codec.entry(cmd), maxlen=keys.PLANNER_CONTROL_MAXLEN, approximate=True
    )
    return {
        "accepted": True,
        "policy": body.policy,
        "id": entry_id.decode() if isinstance(entry_id, bytes) else entry_id,
    }
