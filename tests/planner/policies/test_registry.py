"""Registry: names, descriptions, parameter validation."""

from __future__ import annotations

import pytest

from planner.policies import registry
from planner.policies.registry import PolicyError


def test_static_is_registered_and_described() -> None:
    assert "static" in registry.names()
    d = registry.describe("static")
    assert d["name"] == "static"
    assert d["params"]["gamma"]["default"] == 0
    assert d["params"]["offload"]["default"] is False
    assert d["doc"]


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
