from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from shared import codec, keys
from shared.control import PolicyCommand
from tests.gateway.conftest import gateway

pytestmark = pytest.mark.anyio

BODY = {"policy": "static", "params": {"gamma": 2}}


async def test_closed_without_a_configured_token_401_bare_403_with_any(r: aioredis.Redis) -> None:
    """No admin token configured: never a 5xx (it used to be a 503); without a token 401, with
    any 403, both saying how to configure one."""
    async with gateway(r) as gw:
        bare = await gw.post("/admin/policy", json=BODY)
        given = await gw.post("/admin/policy", json=BODY, headers={"Authorization": "Bearer x"})
    assert bare.status_code == 401 and bare.json()["error"]["code"] == "unauthorized"
    assert given.status_code == 403 and given.json()["error"]["code"] == "admin_disabled"
    assert given.json()["error"]["type"] == "permission_error" and "Retry-After" not in given.headers
    for resp in (bare, given):
        assert "NIGHTJAR_ADMIN_TOKEN" in resp.json()["error"]["message"]
    assert await r.xlen(keys.PLANNER_CONTROL_STREAM) == 0


async def test_token_is_required_and_checked(r: aioredis.Redis) -> None:
    async with gateway(r, admin_token="s3cret") as gw:
        assert (await gw.post("/admin/policy", json=BODY)).status_code == 401
        assert (
            await gw.post("/admin/policy", json=BODY, headers={"Authorization": "Basic s3cret"})
        ).status_code == 401
        empty = await gw.post("/admin/policy", json=BODY, headers={"Authorization": "Bearer "})
        assert empty.status_code == 401
        assert (
            await gw.post("/admin/policy", json=BODY, headers={"Authorization": "Bearer nope"})
        ).status_code == 403
        assert await r.xlen(keys.PLANNER_CONTROL_STREAM) == 0
        ok = await gw.post("/admin/policy", json=BODY, headers={"Authorization": "Bearer s3cret"})
        bad = await gw.post("/admin/policy", json={"params": {}}, headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 202 and ok.json()["accepted"]
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "policy"
    ((_, fields),) = await r.xrange(keys.PLANNER_CONTROL_STREAM)
    cmd = codec.from_entry(fields)
    assert isinstance(cmd, PolicyCommand) and cmd.policy == "static" and cmd.params == {"gamma": 2}
