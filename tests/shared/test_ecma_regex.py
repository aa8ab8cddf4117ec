"""Regexes and JSON-schema patterns have ECMA-262's ``\\d``, ``\\w`` and ``\\s``: ASCII digits
and word characters, ECMA's white space — not Unicode's classes (``\\d`` matched U+1FBF8, a
segmented digit, before). Checked on the grammar the engine runs (``shared.grammar``)
against a byte-level tokenizer that can spell any character."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import llguidance
import llguidance.hf
import pytest
from transformers import AutoTokenizer

from shared.ecma_regex import ecma_classes, ecma_schema
from shared.grammar import grammar_text
from shared.structured import StructuredOutput

TOKENIZER = Path(__file__).resolve().parents[2] / "models" / "nj-target"
SEGMENTED_EIGHT, ARABIC_THREE, NEL, NBSP = "\U0001fbf8", "\u0663", "\u0085", "\u00a0"


@cache
def _tokenizer() -> tuple[object, llguidance.LLTokenizer]:
    tok = AutoTokenizer.from_pretrained(TOKENIZER)
    return tok, llguidance.hf.from_tokenizer(tok)


def matches(spec: StructuredOutput, text: str) -> bool:
    """Whether the grammar of ``spec`` accepts exactly ``text``."""
    tok, llt = _tokenizer()
    m = llguidance.LLMatcher(llt, grammar_text(spec), log_level=0)
    assert not m.is_error(), m.get_error()
    ids = tok.encode(text, add_special_tokens=False)  # type: ignore[attr-defined]
    return all(m.consume_token(t) for t in ids) and bool(m.is_accepting())


CASES = [
    (r"\d+", "2024", True),
    (r"\d+", SEGMENTED_EIGHT, False),
    (r"\d+", ARABIC_THREE, False),
    (r"[\d]+", SEGMENTED_EIGHT, False),
    (r"\D", SEGMENTED_EIGHT, True),
    (r"[^\d]", "7", False),
    (r"\w+", "snake_case9", True),
    (r"\w+", "é", False),
    (r"\W", "é", True),
    (r"\s", NBSP, True),  # ECMA's white space has NBSP...
    (r"\s", NEL, False),  # ...and not U+0085, which Unicode's White_Space has
    (r"\S", NEL, True),
    (r"[\d-z]+", "1-z", True),  # a class next to '-' is not a range (ECMA)
    (r"\\d", "\\d", True),  # an escaped backslash stays one
]


@pytest.mark.parametrize(("pattern", "text", "accepted"), CASES)
def test_a_regex_has_ecma_classes(pattern: str, text: str, accepted: bool) -> None:
    assert matches(StructuredOutput(regex=pattern), text) is accepted


@pytest.mark.parametrize(("pattern", "text", "accepted"), CASES)
def test_a_json_schema_pattern_has_ecma_classes(pattern: str, text: str, accepted: bool) -> None:
    schema = {"type": "string", "pattern": f"^{pattern}$"}
    quoted = '"' + text.replace("\\", "\\\\") + '"'
    assert matches(StructuredOutput(json=schema), quoted) is accepted


def test_the_rewrite_touches_only_the_class_escapes() -> None:
    assert ecma_classes(r"a\d\.\x{41}\p{L}\\w") == r"a[0-9]\.\x{41}\p{L}\\w"
    assert ecma_classes(r"[\W\s]") == r"[[^0-9A-Za-z_][" + ecma_classes(r"\s")[1:] + "]"
    assert ecma_classes("trailing\\") == "trailing\\"


def test_a_schemas_patterns_are_rewritten_and_its_data_is_not() -> None:
    schema = {
        "type": "object",
        "properties": {
            "pattern": {"type": "string", "pattern": r"\d"},  # a property named "pattern"
            "code": {"const": r"\d", "default": {"pattern": r"\d"}},
        },
        "patternProperties": {r"^x\d$": {"type": "string", "pattern": r"\s"}},
        "items": [{"pattern": r"\w"}],
    }
    out = ecma_schema(schema)
    assert out["properties"]["pattern"]["pattern"] == "[0-9]"
    assert out["properties"]["code"] == {"const": r"\d", "default": {"pattern": r"\d"}}
    assert list(out["patternProperties"]) == ["^x[0-9]$"]
    assert out["patternProperties"]["^x[0-9]$"]["pattern"] == ecma_classes(r"\s")
    assert out["items"] == [{"pattern": "[0-9A-Za-z_]"}]
    assert schema["properties"]["pattern"]["pattern"] == r"\d"  # not changed in place


def test_a_tool_calls_argument_patterns_are_ecma_too() -> None:
    from shared.grammar import tool_call_grammar
    from shared.structured import Tool

    tool = Tool.model_validate(
        {
            "function": {
                "name": "f",
                "parameters": {
                    "type": "object",
                    "properties": {"n": {"type": "string", "pattern": r"^\d+$"}},
                    "required": ["n"],
                },
            }
        }
    )
    spec = tool_call_grammar([tool], parallel=False)
    call = '<tool_call>\n{"name": "f", "arguments": {"n": "%s"}}\n</tool_call>'
    assert matches(spec, call % "42")
    assert not matches(spec, call % SEGMENTED_EIGHT)
