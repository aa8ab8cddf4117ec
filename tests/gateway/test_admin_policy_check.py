"""POST /admin/policy checks a swap against the planner's catalogue of policies and their
parameters (keys.PLANNER_POLICIES): what the planner would refuse is a 400 naming the field,
and nothing reaches the planner's control stream."""

from __future__ import annotations

from typing import Any

import pytest
import redis.asyncio as aioredis

from planner.policies import registry
from shared import codec, keys
from shared.control import PolicyCommand
from tests.gateway.conftest import gateway

pytestmark = pytest.mark.anyio
AUTH = {"Authorization": "Bearer s3cret"}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"policy": "no-such-policy"}, "policy"),
        ({"policy": "static", "params": {"gama": 2}}, "params.gama"),
        ({"policy": "static", "params": {"gamma": "many"}}, "params.gamma"),
        ({"policy": "nightjar", "params": {"offload_low_free": 2}}, "params.offload_low_free"),
    ],
)
async def test_a_swap_the_planner_would_refuse_is_a_400_naming_the_field(
    r: aioredis.Redis, body: dict[str, Any], field: str
) -> None:
    await r.set(keys.PLANNER_POLICIES, registry.catalogue_json())
    async with gateway(r, admin_token="s3cret") as gw:
        resp = await gw.post("/admin/policy", json=body, headers=AUTH)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["code"] == "bad_request" and error["param"] == field
    assert field.removeprefix("params.") in error["message"]
    assert await r.xlen(keys.PLANNER_CONTROL_STREAM) == 0


async def test_a_good_swap_is_sent_as_before(r: aioredis.Redis) -> None:
    await r.set(keys.PLANNER_POLICIES, registry.catalogue_json())
    async with gateway(r, admin_token="s3cret") as gw:
        resp = await gw.post(
            "/admin/policy", json={"policy": "static", "params": {"gamma": "2"}}, headers=AUTH
        )
    assert resp.status_code == 202 and resp.json()["accepted"]
    ((_, fields),) = await r.xrange(keys.PLANNER_CONTROL_STREAM)
    cmd = codec.from_entry(fields)
    assert isinstance(cmd, PolicyCommand) and cmd.policy == "static" and cmd.params == {"gamma": "2"}
