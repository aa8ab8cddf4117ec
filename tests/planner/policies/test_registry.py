"""Registry: names, descriptions, parameter validation."""

from __future__ import annotations

import copy
from pathlib import Path

import msgpack
import pytest

from planner.policies import registry
from planner.policies.base import Policy
from planner.policies.registry import PolicyError
from planner.sim import Runner, SimWorker
from tests.planner.scenarios import busy_and_quiet


def test_static_is_registered_and_described() -> None:
    assert "static" in registry.names()
    d = registry.describe("static")
    assert d["name"] == "static"
    assert d["params"]["gamma"]["default"] == 0
    assert d["params"]["offload"]["default"] is False
    assert d["doc"]


def test_the_baselines_live_apart_under_their_names() -> None:
    """The simulator's and the benchmarks' baselines are in planner/baselines/; the registry
    still offers every policy by the same name."""
    assert registry.names() == [
        "bandit",
        "cost-model",
        "exp3",
        "hedge",
        "nightjar",
        "static",
        "threshold",
        "ucb",
    ]
    for name in ("threshold", "ucb", "exp3", "cost-model"):
        assert registry.policy_class(name).__module__.startswith("planner.baselines."), name
    for name in ("bandit", "hedge", "nightjar", "static"):
        assert registry.policy_class(name).__module__.startswith("planner.policies."), name
    here = Path(registry.__file__).parent
    assert not {"threshold.py", "ucb.py", "exp3.py", "cost_model.py", "rewards.py", "costs.py"} & {
        f.name for f in here.glob("*.py")
    }


def test_every_policy_describes_every_param() -> None:
    for name in registry.names():
        d = registry.describe(name)
        for pname, p in d["params"].items():
            assert set(p) == {"default", "doc", "type"}, (name, pname)
            assert p["doc"], (name, pname)
        registry.create(name)  # defaults must construct


def test_unknown_name() -> None:
    with pytest.raises(PolicyError, match=r"unknown policy 'nope'.*static"):
        registry.create("nope")
    with pytest.raises(PolicyError):
        registry.describe("nope")


def test_unknown_param() -> None:
    with pytest.raises(PolicyError, match=r"no parameter.*gama.*takes: drafter, gamma, offload"):
        registry.create("static", gama=2)


@pytest.mark.parametrize("value", ["x", -1, 1.5, True, None])
def test_bad_value(value: object) -> None:
    with pytest.raises(PolicyError, match="'gamma'"):
        registry.create("static", gamma=value)


def test_string_values_parse() -> None:
    p = registry.create("static", gamma="3", offload="false", drafter="d1")
    c = p.decide(0.0)
    assert c.gamma_table[-1][1] == 3 and c.drafter == "d1" and c.offload is False


def test_static_offload_forces_gamma_zero() -> None:
    c = registry.create("static", gamma=4, offload=True).decide(0.0)
    assert c.offload and all(g == 0 for _, g in c.gamma_table)


def test_policy_error_is_value_error() -> None:
    assert issubclass(PolicyError, ValueError)


# ------------------------------------------------------------ state survives a restart

RESTART_PARAMS: dict[str, dict[str, object]] = {
    "static": {"gamma": 2},
    "nightjar": {"offload_min_hold": 16},
    "bandit": {"offload_min_hold": 16},
    "hedge": {"gamma_rule": "acceptance", "select": "sample"},
    "threshold": {},
    "ucb": {},
    "exp3": {"seed": 3},
    "cost-model": {"offload": True, "probe_every": 20},
}


def test_every_registered_policy_is_covered() -> None:
    assert set(RESTART_PARAMS) == set(registry.names())


@pytest.mark.parametrize("name", sorted(RESTART_PARAMS))
def test_state_round_trips_and_a_restored_policy_continues(name: str) -> None:
    """Run 600 steps, persist the state through msgpack (string keys only, as Redis gets
    it), build a fresh policy from it, and run both on copies of the same world: every
    later decision must be identical to the one of the policy that never stopped."""
    params = RESTART_PARAMS[name]
    world = busy_and_quiet()

    def create() -> Policy:
        policy = registry.create(name, **params)
        if name == "nightjar":  # it speculates only by a profile (the world's own curves)
            policy.use_profile(world.curves.to_profile())
        return policy

    policy = create()
    runner = Runner(policy, SimWorker(world, seed=7), delay=3)
    runner.run(600)
    blob = msgpack.packb(policy.state_dict(), use_bin_type=True)
    state = msgpack.unpackb(blob, raw=False, strict_map_key=True)
    assert state == policy.state_dict()
    restored = create()
    restored.load_state_dict(state)
    assert restored.state_dict() == state
    twin, amnesiac = copy.deepcopy(runner), copy.deepcopy(runner)
    twin.policy = restored
    amnesiac.policy = create()
    before = len(runner.trace.decisions)
    for r in (runner, twin, amnesiac):
        r.run(700)
    assert runner.trace.decisions[before:] == twin.trace.decisions[before:]
    assert runner.trace.gamma == twin.trace.gamma
    if name not in ("static", "threshold"):  # a learner restarted without its state acts differently
        assert runner.trace.decisions[before:] != amnesiac.trace.decisions[before:]


def test_bandit_state_of_other_shape_is_refused() -> None:
    state = registry.create("bandit").state_dict()
    with pytest.raises(ValueError, match="shape"):
        registry.create("bandit", gamma_max=3).load_state_dict(state)


def test_doc_example_policy() -> None:
    """The example in docs/planner.md works as written and plugs into the registry."""
    doc = (Path(__file__).parents[3] / "docs" / "planner.md").read_text()
    section = doc.split("## Adding a policy", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict[str, object] = {}
    exec(compile(code, "docs/planner.md", "exec"), namespace)
    cls = namespace["RoundRobinPolicy"]
    assert isinstance(cls, type) and issubclass(cls, Policy)
    registry.register("round-robin", cls)
    try:
        assert registry.describe("round-robin")["params"]["gamma_max"]["default"] == 3
        policy = registry.create("round-robin", gamma_max="2")
        assert [policy.decide(0.0).gamma_table[0][1] for _ in range(4)] == [1, 2, 0, 1]
        again = registry.create("round-robin", gamma_max=2)
        again.load_state_dict(msgpack.unpackb(msgpack.packb(policy.state_dict())))
        assert again.decide(0.0) == policy.decide(0.0)
        with pytest.raises(PolicyError, match="already taken"):
            registry.register("round-robin", cls)
    finally:
        registry._POLICIES.pop("round-robin")
