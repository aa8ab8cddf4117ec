"""Declared policy parameters: default, documentation, and a parser that validates a value.

Parameters reach a policy from the CLI or a PolicyCommand, so values may arrive as strings
("4", "true", "1,2,4"); each parser accepts those spellings and raises ValueError with a
message that says what it expected.

Each policy declares its parameters in ``PARAMS`` (planner/policies/, planner/baselines/).
Every declaration is also plain data (``Param.spec``: the factory and its arguments), so the
planner publishes the catalogue of its policies' parameters (``keys.PLANNER_POLICIES``) and
the gateway checks a requested swap against it with the very same parsers (``problem``),
answering 400 naming the bad field instead of accepting a swap the planner will refuse.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Parser = Callable[[Any], Any]


@dataclass(frozen=True)
class Param:
    """One named parameter of a policy."""

    default: Any
    doc: str
    parse: Parser
    type_name: str
    spec: dict[str, Any] = field(default_factory=dict, compare=False)  # the factory and its arguments

    def describe(self) -> dict[str, Any]:
        return {"default": self.default, "doc": self.doc, "type": self.type_name}


def _as_int(v: Any) -> int:
    if isinstance(v, bool):
        raise ValueError(f"expected an integer, got boolean {v!r}")
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str):
        try:
            return int(v.strip())
        except ValueError:
            pass
    raise ValueError(f"expected an integer, got {v!r}")


def _as_float(v: Any) -> float:
    if isinstance(v, bool):
        raise ValueError(f"expected a number, got boolean {v!r}")
    if isinstance(v, int | float):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v.strip())
        except ValueError:
            pass
    raise ValueError(f"expected a number, got {v!r}")


def _as_bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    if isinstance(v, str) and v.strip().lower() in ("true", "1", "yes", "on", "false", "0", "no", "off"):
        return v.strip().lower() in ("true", "1", "yes", "on")
    raise ValueError(f"expected a boolean, got {v!r}")


def int_param(default: int, doc: str, lo: int | None = None, hi: int | None = None) -> Param:
    def parse(v: Any) -> int:
        x = _as_int(v)
        if lo is not None and x < lo:
            raise ValueError(f"must be >= {lo}, got {x}")
        if hi is not None and x > hi:
            raise ValueError(f"must be <= {hi}, got {x}")
        return x

    return Param(default, doc, parse, "int", {"kind": "int", "lo": lo, "hi": hi})


def float_param(default: float, doc: str, lo: float | None = None, hi: float | None = None) -> Param:
    def parse(v: Any) -> float:
        x = _as_float(v)
        if lo is not None and x < lo:
            raise ValueError(f"must be >= {lo}, got {x}")
        if hi is not None and x > hi:
            raise ValueError(f"must be <= {hi}, got {x}")
        return x

    return Param(default, doc, parse, "float", {"kind": "float", "lo": lo, "hi": hi})


def bool_param(default: bool, doc: str) -> Param:
    return Param(default, doc, _as_bool, "bool", {"kind": "bool"})


def str_param(default: str | None, doc: str, choices: Sequence[str] | None = None) -> Param:
    """A string; ``None`` is accepted only when the default is ``None``."""

    def parse(v: Any) -> str | None:
        if v is None and default is None:
            return None
        if not isinstance(v, str) or not v:
            raise ValueError(f"expected a non-empty string, got {v!r}")
        if choices is not None and v not in choices:
            raise ValueError(f"expected one of {list(choices)}, got {v!r}")
        return v

    type_name = "str" if choices is None else "|".join(choices)
    type_name = type_name if default is not None else f"{type_name}|None"
    return Param(
        default, doc, parse, type_name, {"kind": "str", "choices": None if choices is None else list(choices)}
    )


def int_list_param(default: list[int] | str, doc: str, allow_names: Sequence[str] = ()) -> Param:
    """A strictly increasing list of positive ints, a "1,2,4" string, or one of ``allow_names``."""

    def parse(v: Any) -> list[int] | str:
        if isinstance(v, str) and v in allow_names:
            return v
        items = v.split(",") if isinstance(v, str) else v
        if not isinstance(items, list | tuple) or not items:
            raise ValueError(f"expected a non-empty integer list or one of {list(allow_names)}, got {v!r}")
        xs = [_as_int(x) for x in items]
        if xs[0] < 1 or any(b <= a for a, b in itertools.pairwise(xs)):
            raise ValueError(f"expected positive, strictly increasing integers, got {xs}")
        return xs

    type_name = "list[int]" + "".join(f"|{n}" for n in allow_names)
    return Param(default, doc, parse, type_name, {"kind": "int_list", "allow_names": list(allow_names)})


_FACTORIES: dict[str, Callable[..., Param]] = {
    "int": int_param,
    "float": float_param,
    "bool": bool_param,
    "str": str_param,
    "int_list": int_list_param,
}


def from_spec(default: Any, doc: str, spec: Mapping[str, Any]) -> Param:
    """The declaration ``spec`` describes, rebuilt with its factory (the same parser)."""
    args = {k: v for k, v in spec.items() if k != "kind"}
    return _FACTORIES[spec["kind"]](default, doc, **args)


def bad_param(
    policy: str, declared: Mapping[str, Param], params: Mapping[str, Any]
) -> tuple[str, str] | None:
    """The first problem of ``params`` for a policy declaring ``declared``: (the parameter, a
    message naming the policy and the parameter), or None when every value parses."""
    unknown = sorted(set(params) - set(declared))
    if unknown:
        known = ", ".join(sorted(declared)) or "(none)"
        return unknown[0], f"policy {policy!r} has no parameter(s) {', '.join(unknown)}; it takes: {known}"
    for key, value in params.items():
        try:
            declared[key].parse(value)
        except ValueError as e:
            return key, f"policy {policy!r}, parameter {key!r}: {e}"
    return None


def catalogue(policies: Mapping[str, Mapping[str, Param]]) -> str:
    """JSON: policy name -> parameter -> {"default", "doc", "spec"} (what ``problem`` reads)."""
    return json.dumps(
        {
            name: {k: {"default": p.default, "doc": p.doc, "spec": p.spec} for k, p in params.items()}
            for name, params in policies.items()
        },
        sort_keys=True,
    )


def problem(
    catalogue_json: str | bytes | None, policy: str, params: Mapping[str, Any]
) -> tuple[str, str] | None:
    """What is wrong with a swap to ``policy`` with ``params``, by the planner's catalogue:
    (the field: "policy" or "params.<name>", a message), or None. With no catalogue (no
    planner has started yet) nothing is checked here: the planner checks the swap itself."""
    if catalogue_json is None:
        return None
    try:
        known: dict[str, dict[str, dict[str, Any]]] = json.loads(catalogue_json)
        if policy not in known:
            return "policy", f"unknown policy {policy!r}; known policies: {', '.join(sorted(known))}"
        declared = {k: from_spec(d["default"], d["doc"], d["spec"]) for k, d in known[policy].items()}
    except (ValueError, TypeError, KeyError, AttributeError):  # another version's catalogue
        return None
    bad = bad_param(policy, declared, params)
    return None if bad is None else (f"params.{bad[0]}", bad[1])
