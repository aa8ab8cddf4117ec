"""Declared policy parameters: default, documentation, and a parser that validates a value.

Parameters reach a policy from the CLI or a PolicyCommand, so values may arrive as strings
("4", "true", "1,2,4"); each parser accepts those spellings and raises ValueError with a
message that says what it expected.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

Parser = Callable[[Any], Any]


@dataclass(frozen=True)
class Param:
    """One named parameter of a policy."""

    default: Any
    doc: str
    parse: Parser
    type_name: str

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

    return Param(default, doc, parse, "int")


def float_param(default: float, doc: str, lo: float | None = None, hi: float | None = None) -> Param:
    def parse(v: Any) -> float:
        x = _as_float(v)
        if lo is not None and x < lo:
            raise ValueError(f"must be >= {lo}, got {x}")
        if hi is not None and x > hi:
            raise ValueError(f"must be <= {hi}, got {x}")
        return x

    return Param(default, doc, parse, "float")


def bool_param(default: bool, doc: str) -> Param:
    return Param(default, doc, _as_bool, "bool")


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
    return Param(default, doc, parse, type_name if default is not None else f"{type_name}|None")


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

    return Param(default, doc, parse, "list[int]" + "".join(f"|{n}" for n in allow_names))
