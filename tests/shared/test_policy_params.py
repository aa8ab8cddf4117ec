"""The policies' parameter declarations as data: the planner's catalogue rebuilds every
parser exactly, and a swap is judged from it as the planner's registry judges it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from planner.policies import registry
from shared.policy_params import Param, bad_param, catalogue, from_spec, int_param, problem

PROBES: list[Any] = [
    "3", 3, 0, -1, 2.0, 0.5, "0.25", 1e9, "x", "", True, "true", "off", None,
    "1,2,4", [1, 2, 4], [4, 2], "auto", "ngram", "goodput", "latency", {"a": 1},
]  # fmt: skip


def _outcome(p: Param, value: Any) -> tuple[str, Any]:
    try:
        return "ok", p.parse(value)
    except ValueError as e:
        return "error", str(e)


def test_every_declaration_rebuilds_from_the_catalogue_with_the_same_parser() -> None:
    known = json.loads(registry.catalogue_json())
    assert sorted(known) == registry.names()
    for name in registry.names():
        declared = registry.policy_class(name).PARAMS
        assert sorted(known[name]) == sorted(declared), name
        for key, p in declared.items():
            entry = known[name][key]
            rebuilt = from_spec(entry["default"], entry["doc"], entry["spec"])
            assert rebuilt.type_name == p.type_name and rebuilt.doc == p.doc, (name, key)
            for value in PROBES:
                assert _outcome(rebuilt, value) == _outcome(p, value), (name, key, value)


@pytest.mark.parametrize(
    ("policy", "params", "field"),
    [
        ("no-such-policy", {}, "policy"),
        ("static", {"gama": 2}, "params.gama"),
        ("static", {"gamma": "many"}, "params.gamma"),
        ("static", {"gamma": -1}, "params.gamma"),
        ("nightjar", {"gamma_max": 3, "offload": "perhaps"}, "params.offload"),
        ("cost-model", {"buckets": [4, 2]}, "params.buckets"),
    ],
)
def test_a_bad_swap_names_its_field_and_says_what_the_planner_says(
    policy: str, params: dict[str, Any], field: str
) -> None:
    got = problem(registry.catalogue_json(), policy, params)
    assert got is not None and got[0] == field
    with pytest.raises(registry.PolicyError) as planner_says:
        registry.create(policy, **params)
    assert got[1] == str(planner_says.value)


def test_a_good_swap_or_no_catalogue_passes() -> None:
    cat = registry.catalogue_json()
    assert problem(cat, "static", {"gamma": "2"}) is None
    assert problem(cat, "nightjar", {}) is None
    assert problem(None, "no-such-policy", {"x": 1}) is None  # no planner yet: it checks itself
    assert problem(b"not json", "static", {"gama": 1}) is None
    assert problem(json.dumps({"static": {"gamma": {"spec": {}}}}), "static", {"gamma": 1}) is None


def test_bad_param_and_catalogue_of_a_small_declaration() -> None:
    declared = {"n": int_param(1, "a count", lo=1, hi=8)}
    assert bad_param("p", declared, {"n": "4"}) is None
    assert bad_param("p", declared, {"n": 9}) == ("n", "policy 'p', parameter 'n': must be <= 8, got 9")
    assert json.loads(catalogue({"p": declared})) == {
        "p": {"n": {"default": 1, "doc": "a count", "spec": {"kind": "int", "lo": 1, "hi": 8}}}
    }
