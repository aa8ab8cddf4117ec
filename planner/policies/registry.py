"""Policies by name: create one from (possibly string-typed) parameters, list, describe.

The planner service builds its running policy with ``create(name, **params)`` when it starts
and whenever a PolicyCommand asks for a swap; a bad name or parameter raises PolicyError
(a ValueError) whose message is fit to show the operator as is.
"""

from __future__ import annotations

import importlib
from typing import Any

from planner.policies.base import Policy
from shared.policy_params import bad_param, catalogue

# The one table of policy names: name -> "module:Class" (imported lazily so a broken optional
# policy cannot take down the rest) or a class registered at run time. planner.settings'
# DEFAULT_POLICY names one of them.
_POLICIES: dict[str, str | type[Policy]] = {
    "static": "planner.policies.static:StaticPolicy",
    "nightjar": "planner.policies.nightjar:NightjarPolicy",
    "bandit": "planner.policies.bandit:BanditPolicy",
    "hedge": "planner.policies.hedge:HedgePolicy",
    "threshold": "planner.baselines.threshold:ThresholdPolicy",
    "ucb": "planner.baselines.ucb:UCBPolicy",
    "exp3": "planner.baselines.exp3:Exp3Policy",
    "cost-model": "planner.baselines.cost_model:CostModelPolicy",
}


class PolicyError(ValueError):
    """Unknown policy name, unknown parameter, or a parameter value that does not parse."""


def names() -> list[str]:
    """Every registered policy name, sorted."""
    return sorted(_POLICIES)


def register(name: str, target: str | type[Policy]) -> None:
    """Make a policy available by name: a Policy subclass, or "module:Class" to import lazily."""
    if not name or name in _POLICIES:
        raise PolicyError(f"policy name {name!r} is empty or already taken")
    _POLICIES[name] = target


def policy_class(name: str) -> type[Policy]:
    if name not in _POLICIES:
        raise PolicyError(f"unknown policy {name!r}; known policies: {', '.join(names())}")
    target = _POLICIES[name]
    if not isinstance(target, str):
        return target
    module, cls_name = target.split(":")
    cls: type[Policy] = getattr(importlib.import_module(module), cls_name)
    return cls


def resolve_params(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """Defaults overlaid with ``params``, each parsed; raises PolicyError on any problem."""
    spec = policy_class(name).PARAMS
    bad = bad_param(name, spec, params)
    if bad is not None:
        raise PolicyError(bad[1])
    return {k: p.default for k, p in spec.items()} | {k: spec[k].parse(v) for k, v in params.items()}


def catalogue_json() -> str:
    """Every policy's declared parameters as JSON (``shared.policy_params.catalogue``): the
    planner publishes it so that a swap is checked where it is asked for. A policy that cannot
    be imported is left out (the planner refuses a swap to it anyway)."""
    declared = {}
    for name in names():
        try:
            declared[name] = policy_class(name).PARAMS
        except Exception:  # a broken optional policy must not take down the rest
            continue
    return catalogue(declared)


def create(name: str, **params: Any) -> Policy:
    """A new policy ``name`` with ``params`` (unknown names/params or bad values: PolicyError)."""
    cls = policy_class(name)
    resolved = resolve_params(name, params)
    try:
        return cls(**resolved)
    except ValueError as e:  # cross-parameter checks done by the policy itself
        raise PolicyError(f"policy {name!r}: {e}") from None


def describe(name: str) -> dict[str, Any]:
    """{"name", "doc", "params": {param: {"default", "doc", "type"}}} for one policy."""
    cls = policy_class(name)
    doc = (cls.__doc__ or "").strip().split("\n\n")[0]
    return {
        "name": name,
        "doc": " ".join(doc.split()),
        "params": {k: p.describe() for k, p in cls.PARAMS.items()},
    }
