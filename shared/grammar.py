"""A ``StructuredOutput`` as an llguidance grammar, and the check that a grammar compiles.

The gateway calls ``problem`` to refuse, with a 400, a schema, regex or grammar the grammar
engine rejects before a job is queued; the worker's engine compiles the same text
(``grammar_text``) against its tokenizer (worker/engine/grammar.py). Both are cached per
constraint. JSON is generated on one line with ``", "`` and ``": "`` between items (no free
whitespace: a weak model cannot wander off into blanks), unless a schema's own
``x-guidance`` says otherwise. A regex, like a schema's ``pattern``, has ECMA-262's ``\\d``,
``\\w`` and ``\\s`` (``shared/ecma_regex.py``); a Lark grammar's terminals keep Lark's syntax.
"""

from __future__ import annotations

import json
from functools import lru_cache

import llguidance

from shared.ecma_regex import ecma_classes, ecma_schema
from shared.structured import StructuredOutput, Tool

JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
ANY_OBJECT: dict[str, object] = {"type": "object"}
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"


def grammar_text(spec: StructuredOutput) -> str:
    """The llguidance grammar of ``spec`` (not yet checked: see ``problem``)."""
    return _grammar(spec.key())


def problem(spec: StructuredOutput) -> str | None:
    """Why the grammar engine refuses ``spec`` (None: it compiles)."""
    return _problem(spec.key())


@lru_cache(maxsize=512)
def _grammar(key: str) -> str:
    spec = StructuredOutput.model_validate_json(key)
    try:
        if spec.json_schema is not None or spec.json_object:
            schema = ecma_schema(spec.json_schema) if spec.json_schema is not None else ANY_OBJECT
            return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)  # type: ignore[arg-type]
        if spec.regex is not None:  # ECMA-262's \d \w \s, as JSON Schema's pattern has them
            return llguidance.LLMatcher.grammar_from_regex(ecma_classes(spec.regex))
        if spec.choice is not None:
            return llguidance.grammar_from("choice", json.dumps(spec.choice))
        assert spec.grammar is not None
        return llguidance.grammar_from("grammar", spec.grammar)
    except (ValueError, RuntimeError, RecursionError) as exc:  # the engine's refusals: a 400
        return json.dumps({"error": str(exc) or type(exc).__name__})  # refused by _problem


@lru_cache(maxsize=512)
def _problem(key: str) -> str | None:
    text = _grammar(key)
    if text.startswith('{"error": '):
        return str(json.loads(text)["error"])
    try:
        message = llguidance.LLMatcher.validate_grammar(text)
    except (ValueError, RuntimeError) as exc:
        message = str(exc) or type(exc).__name__
    return f"the grammar engine refused the constraint: {message}"[:2000] if message else None


def tool_call_grammar(tools: list[Tool], parallel: bool) -> StructuredOutput:
    """Output that is one or more (``parallel``) Hermes-style calls of ``tools``:
    ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, arguments matching the
    function's ``parameters`` schema."""
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"const": t.function.name},
                "arguments": ecma_schema(t.function.parameters) if t.function.parameters else ANY_OBJECT,
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    schema = {**({"anyOf": calls} if len(calls) > 1 else calls[0]), "x-guidance": JSON_OPTIONS}
    call = f'"{TOOL_CALL_OPEN}\\n" %json {json.dumps(schema)} "\\n{TOOL_CALL_CLOSE}"'
    start = 'call ("\\n" call)*' if parallel else "call"
    return StructuredOutput(grammar=f"start: {start}\ncall: {call}\n")
