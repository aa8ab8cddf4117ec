"""ECMA-262's character class escapes for the grammar engine's regexes.

JSON Schema's ``pattern`` is an ECMA-262 regular expression, and so, for vLLM's clients,
is a ``guided_regex`` / ``structured_outputs.regex`` (it is what a JavaScript or JSON Schema
user means). There ``\\d`` is ``[0-9]``, ``\\w`` is ``[A-Za-z0-9_]`` and ``\\s`` is ECMA's
white space and line terminators; llguidance's regex syntax (Rust's ``regex``) reads them as
Unicode classes, so ``\\d`` also matched U+1FBF8 (a segmented digit) and every other decimal
digit of Unicode. ``ecma_classes`` spells the six escapes (and their negations ``\\D``,
``\\W``, ``\\S``) out as explicit classes; a bracketed class is valid both alone and inside
another class in that syntax, so no parsing of the pattern is needed beyond its escapes.
llguidance's JSON-schema compiler has ASCII ``\\d`` and ``\\w`` but Unicode's ``\\s`` (U+0085
in, U+FEFF out); ``ecma_schema`` rewrites a schema's patterns the same way, so both agree
with ECMA-262 (tests/shared/test_ecma_regex.py).
"""

from __future__ import annotations

from typing import Any

DIGIT = "0-9"
WORD = "0-9A-Za-z_"
# ECMA-262 WhiteSpace (TAB, VT, FF, SP, NBSP, ZWNBSP and the Zs category) and LineTerminator.
SPACE = r"\t\n\x0B\x0C\r\x20\xA0\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}\x{FEFF}"
CLASSES = {"d": DIGIT, "w": WORD, "s": SPACE}
HEX_ESCAPES = frozenset("xupP")  # escapes that may take a braced argument: \x{..}, \u{..}, \p{..}


def ecma_classes(pattern: str) -> str:
    """``pattern`` with ``\\d \\w \\s \\D \\W \\S`` as ECMA-262 defines them (everything else
    unchanged: an escaped backslash stays one, braced escapes are copied whole)."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c != "\\" or i + 1 == n:
            out.append(c)
            i += 1
            continue
        e = pattern[i + 1]
        if e.lower() in CLASSES:
            out.append(("[" if e.islower() else "[^") + CLASSES[e.lower()] + "]")
            i += 2
        elif e in HEX_ESCAPES and i + 2 < n and pattern[i + 2] == "{":
            end = pattern.find("}", i + 3)
            end = n - 1 if end < 0 else end
            out.append(pattern[i : end + 1])
            i = end + 1
        else:
            out.append(pattern[i : i + 2])
            i += 2
    return "".join(out)


DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})  # values, not schemas


def ecma_schema(schema: Any) -> Any:
    """A JSON schema with every regex in it (``pattern``, ``patternProperties``' names) given
    ECMA-262's classes; values under ``const``, ``enum``, ``default``, ``examples`` are data
    and stay as they are. A new object: ``schema`` is not changed."""
    if isinstance(schema, list):
        return [ecma_schema(x) for x in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "pattern" and isinstance(value, str):
            out[key] = ecma_classes(value)
        elif key == "patternProperties" and isinstance(value, dict):
            out[key] = {ecma_classes(k): ecma_schema(v) for k, v in value.items()}
        elif key in DATA_KEYWORDS:
            out[key] = value
        else:
            out[key] = ecma_schema(value)
    return out
