"""The planner service on the embedded Redis: decisions, live swaps, restarts."""

from __future__ import annotations

import time
from typing import Any

import anyio
import msgpack
import pytest
import redis.asyncio as aioredis

from planner.policies import registry
from planner.policies.base import Choice, Policy
from planner.service import PlannerService
from planner.settings import PlannerSettings
from shared import codec, keys
from shared.control import ALL_BATCHES, Decision, PolicyCommand, StepCosts, Telemetry

pytestmark = pytest.mark.anyio


class Counting(Policy):
    """Test policy: γ = number of telemetry messages observed (its learned state)."""

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.seen = 0

    def observe(self, t: Telemetry) -> None:
        self.seen += 1

    def decide(self, now: float) -> Choice:
        return Choice(gamma_table=[(ALL_BATCHES, self.seen)], note=f"seen {self.seen}")

    def state_dict(self) -> dict[str, Any]:
        return {"seen": self.seen}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seen = int(state["seen"])


def factory(name: str, **params: Any) -> Policy:
    return Counting(**params) if name == "counting" else registry.create(name, **params)


def _planner(r: aioredis.Redis, **kw: Any) -> PlannerService:
    kw.setdefault("policy", "static")
    return PlannerService(PlannerSettings(**kw), redis=r, factory=factory)


async def _latest(r: aioredis.Redis) -> Decision:
    return codec.decode_as(await r.get(keys.DECISION_LATEST), Decision)


async def _stream(r: aioredis.Redis) -> list[Decision]:
    return [codec.decode_as(f[codec.FIELD], Decision) for _, f in await r.xrange(keys.DECISIONS_STREAM)]


async def _command(r: aioredis.Redis, policy: str, **params: Any) -> None:
    await r.xadd(keys.PLANNER_CONTROL_STREAM, codec.entry(PolicyCommand(policy=policy, params=params)))


async def test_start_publishes_a_versioned_decision(r: aioredis.Redis) -> None:
    p = _planner(r, params={"gamma": 2}, valid_for_s=30)
    d = await p.start()
    assert d.version == 1 and d.policy == "static" and d.gamma_for(1) == 2 and d.valid_for_s == 30
    assert await _latest(r) == d and await _stream(r) == [d]
    assert await r.get(keys.DECISION_VERSION) == b"1"


async def test_start_publishes_the_catalogue_the_gateway_checks_swaps_with(r: aioredis.Redis) -> None:
    await _planner(r).start()  # a test factory: its policies are not the registry's
    assert await r.get(keys.PLANNER_POLICIES) is None
    await PlannerService(PlannerSettings(policy="static"), redis=r).start()
    assert await r.get(keys.PLANNER_POLICIES) == registry.catalogue_json().encode()


async def test_unchanged_decision_is_republished_only_when_aging(r: aioredis.Redis) -> None:
    p = _planner(r, republish_s=10)
    await p.start()
    assert await p.decide() is None  # same choice, still fresh
    assert p.publisher.last is not None
    p.publisher.last = p.publisher.last.model_copy(update={"created_at": time.time() - 11})
    again = await p.decide()
    assert again is not None and again.version == 2 and (await _latest(r)).version == 2


class Drifting(Policy):
    """Test policy: a cost rule whose plain step cost the test moves, and a γ it may change."""

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.plain_s, self.gamma = 0.010, 0

    def observe(self, t: Telemetry) -> None:
        pass

    def decide(self, now: float) -> Choice:
        costs = [StepCosts(batch=1, plain_s=self.plain_s, spec_s={"ngram": [0.012]})]
        return Choice(gamma_table=[(ALL_BATCHES, self.gamma)], step_costs=costs, acceptance={"ngram": 0.5})


async def test_a_move_of_the_cost_rule_alone_is_published_at_most_every_rule_publish_s(
    r: aioredis.Redis,
) -> None:
    """Step costs that jitter by more than 3 % are news, published once a second at most (a
    decision on every jitter made 14 a second at one user); any other change goes out at once."""
    p = PlannerService(
        PlannerSettings(policy="drifting", republish_s=10, rule_publish_s=1.0),
        redis=r,
        factory=lambda name, **kw: Drifting(**kw),
    )
    first = await p.start()
    policy = p.slot.policy
    assert isinstance(policy, Drifting)
    policy.plain_s = 0.011  # 10 % more: the rule moved
    assert await p.decide() is None  # within a second of the last decision
    policy.gamma = 2
    reshaped = await p.decide()  # what runs changed: at once
    assert reshaped is not None and reshaped.gamma_for(1) == 2 and reshaped.step_costs[0].plain_s == 0.011
    policy.plain_s = 0.013
    assert await p.decide() is None
    assert p.publisher.last is not None
    p.publisher.last = p.publisher.last.model_copy(update={"created_at": time.time() - 1.5})
    moved = await p.decide()  # a second on: the move goes out
    assert moved is not None and moved.step_costs[0].plain_s == 0.013
    assert [d.version for d in await _stream(r)] == [first.version, reshaped.version, moved.version]
    p.publisher.last = moved.model_copy(update={"created_at": time.time() - 1.5})
    assert await p.decide() is None  # nothing moved: nothing to say until it ages


async def test_policy_swaps_live_and_bad_commands_keep_the_old_policy(r: aioredis.Redis) -> None:
    p = _planner(r)
    await p.start()
    await _command(r, "static", gamma="3")
    await _command(r, "nope")
    await _command(r, "static", gamma="many")
    await r.xadd(keys.PLANNER_CONTROL_STREAM, {b"m": b"junk"})
    assert await p.read_control(block_ms=None) == 4
    swapped, unknown, bad, junk = (await _stream(r))[1:]
    assert swapped.gamma_for(1) == 3 and "static -> static" in swapped.note
    assert unknown.note.startswith("error: cannot use policy 'nope'") and unknown.gamma_for(1) == 3
    assert bad.note.startswith("error: cannot use policy 'static'") and bad.gamma_for(1) == 3
    assert junk.note.startswith("error: malformed policy command")
    assert [d.version for d in (swapped, unknown, bad, junk)] == [2, 3, 4, 5]
    active = codec.decode_as(await r.get(keys.PLANNER_ACTIVE), PolicyCommand)
    assert active.policy == "static" and active.params == {"gamma": "3"}
    pending = await r.xpending(keys.PLANNER_CONTROL_STREAM, keys.PLANNER_CONTROL_GROUP)
    assert pending["pending"] == 0


async def test_every_decision_names_the_command_whose_policy_made_it(r: aioredis.Redis) -> None:
    """A swap's decision and every later one of that policy — a periodic republish whose note
    no longer says who asked, a failed swap that kept it, a restart — carry the id of the
    control entry that put the policy in place: how a caller finds out its swap is in force."""
    p = _planner(r, republish_s=10)
    first = await p.start()
    assert first.command_id == ""  # the planner's own default
    cmd = PolicyCommand(policy="static", params={"gamma": 2}, requested_by="admin api")
    cmd_id = (await r.xadd(keys.PLANNER_CONTROL_STREAM, codec.entry(cmd))).decode()
    await p.read_control(block_ms=None)
    swapped = await _latest(r)
    assert swapped.command_id == cmd_id and "by admin api" in swapped.note
    assert p.publisher.last is not None
    p.publisher.last = p.publisher.last.model_copy(update={"created_at": time.time() - 11})
    again = await p.decide()  # republished as it ages: the note is the policy's own now
    assert again is not None and "by admin api" not in again.note and again.command_id == cmd_id
    await _command(r, "nope")
    await p.read_control(block_ms=None)
    refused = await _latest(r)
    assert refused.note.startswith("error:") and refused.command_id == cmd_id
    restarted = await _planner(r).start()
    assert restarted.gamma_for(1) == 2 and restarted.command_id == cmd_id


async def test_telemetry_feeds_the_policy_and_state_survives_a_restart(r: aioredis.Redis) -> None:
    p = _planner(r)
    await p.start()
    await _command(r, "counting")
    await p.read_control(block_ms=None)
    for i in range(3):
        await r.xadd(keys.TELEMETRY_STREAM, codec.entry(Telemetry(worker_id="w", step=i)))
    await r.xadd(keys.TELEMETRY_STREAM, {b"m": b"junk"})
    assert await p.read_telemetry(block_ms=None) == 4
    assert p.observed == 3 and (await _latest(r)).gamma_for(1) == 3  # decided after the batch
    await p.slot.save_state()
    assert msgpack.unpackb(await r.hget(keys.PLANNER_STATE, "counting")) == {"seen": 3}
    # A restarted planner runs the chosen policy again, from its saved state, versions going on.
    again = _planner(r)
    d = await again.start()
    assert d.policy == "counting" and d.gamma_for(1) == 3 and d.version == 4


async def test_run_applies_a_swap_sent_while_it_serves(r: aioredis.Redis) -> None:
    p = _planner(r, block_ms=50, decide_s=0.05)
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(p.run)
            while await r.get(keys.DECISION_LATEST) is None:
                await anyio.sleep(0.01)
            await _command(r, "static", gamma="5")
            while (await _latest(r)).gamma_for(1) != 5:
                await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
    assert await r.hget(keys.PLANNER_STATE, "static") is not None  # saved on the way out


async def test_hedge_publishes_its_drafter_scope(r: aioredis.Redis) -> None:
    """HedgeSpec's per-request scope is the default; a scope change is a new decision."""
    p = _planner(r, policy="hedge")
    d = await p.start()
    assert d.drafter_scope == "request"
    await _command(r, "hedge", scope="batch")
    assert await p.read_control(block_ms=None) == 1
    d2 = await _latest(r)
    assert d2.drafter_scope == "batch" and d2.version > d.version


async def test_only_a_learner_over_the_drafters_asks_for_their_scores(r: aioredis.Redis) -> None:
    """Counterfactual scoring costs the workers a forward of every model drafter per
    speculative step: hedge and bandit with HedgeSpec ask for it (nightjar once it has a
    profile to speculate by); a static or fixed-drafter policy does not, and the change is a
    new decision."""
    p = _planner(r, policy="hedge")
    assert (await p.start()).score_drafters
    for policy, params, wanted in [
        ("static", {"gamma": "4", "drafter": "d"}, False),
        ("bandit", {}, True),
        ("bandit", {"drafter_policy": "fixed"}, False),
        ("nightjar", {}, False),  # no profile yet: plain decoding, nothing to score
        ("threshold", {}, False),
    ]:
        before = await _latest(r)
        await _command(r, policy, **params)
        assert await p.read_control(block_ms=None) == 1
        d = await _latest(r)
        assert d.policy == policy and d.score_drafters is wanted, (policy, params)
        assert d.drafter_costs == {}  # no worker profile here: acceptance alone
        assert d.version > before.version
