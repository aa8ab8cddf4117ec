"""Structured output on the OpenAI routes: ``response_format``, vLLM's ``guided_json`` /
``guided_regex`` / ``guided_choice`` / ``guided_grammar`` and ``structured_outputs``, and a
forced tool call (gateway/tools.py), gathered into at most one ``StructuredOutput``, which
the grammar engine checks before any job exists (shared/grammar.py)."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from gateway.errors import APIError, from_validation
from shared import grammar
from shared.errors import ErrorCode
from shared.structured import StructuredOutput

GUIDED = {
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}
VLLM_KEYS = frozenset({"json", "regex", "choice", "grammar", "json_object"})


def _spec(param: str, fields: dict[str, Any]) -> StructuredOutput:
    try:
        return StructuredOutput.model_validate(fields)
    except ValidationError as exc:
        err = from_validation(exc)
        err.param = param
        raise err from None


def gather(
    response_format: StructuredOutput | None, structured_outputs: dict[str, Any] | None, **guided: Any
) -> dict[str, StructuredOutput]:
    """Every constraint given, by the field it came from (``guided``: the guided_* fields)."""
    out = {"response_format": response_format} if response_format is not None else {}
    for name, value in guided.items():
        if value is not None:
            out[name] = _spec(name, {GUIDED[name]: value})
    if structured_outputs:
        given = {k: v for k, v in structured_outputs.items() if v is not None and k in VLLM_KEYS}
        out["structured_outputs"] = _spec("structured_outputs", given)
    return out


def one(given: dict[str, StructuredOutput]) -> StructuredOutput | None:
    """The request's constraint: at most one may be given (400 otherwise)."""
    if len(given) > 1:
        raise APIError.of(
            ErrorCode.BAD_REQUEST, f"give one constraint, not {' and '.join(given)}", param=next(iter(given))
        )
    return next(iter(given.values()), None)


def check(spec: StructuredOutput | None, param: str) -> None:
    """400 for a constraint the grammar engine refuses."""
    problem = grammar.problem(spec) if spec is not None else None
    if problem:
        raise APIError.of(ErrorCode.BAD_REQUEST, problem, param=param)
