"""Wire types of structured output and tool calling (no grammar engine here: see
``shared/grammar.py``, which turns a ``StructuredOutput`` into an llguidance grammar).

``StructuredOutput`` is vLLM's ``structured_outputs`` (exactly one of ``json``, ``regex``,
``choice``, ``grammar``, ``json_object``); the gateway builds one from ``response_format``,
``guided_*``, ``tools`` + ``tool_choice``, and the job API takes it as ``params.structured``.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_GRAMMAR_CHARS = 1 << 20  # a schema, regex or grammar of at most 1 MiB of text
MAX_REGEX_CHARS = 1 << 16  # a regex of at most 64 KiB
MAX_TOOLS = 128
# A repetition count the grammar engine is asked to unroll: ``x{n}``, ``x{n,m}`` in a regex or
# a schema's ``pattern``, ``x~n..m`` in a Lark grammar, and a schema's length and count bounds.
MAX_REPEAT = 10_000
_REGEX_COUNT = re.compile(r"(?<!\\)\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")
_LARK_COUNT = re.compile(r"~\s*(\d+)(?:\s*\.\.\s*(\d+))?")
_SCHEMA_COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")


def repeat_problem(text: str, lark: bool = False) -> str | None:
    """Why ``text`` (a regex, or a Lark grammar) asks for too many repetitions (None: fine)."""
    for m in (_LARK_COUNT if lark else _REGEX_COUNT).finditer(text):
        if any(g and int(g) > MAX_REPEAT for g in m.groups()):
            return f"a repetition count is at most {MAX_REPEAT} (got {m.group(0)[:40]})"
    return None


def schema_problem(schema: Any, depth: int = 0) -> str | None:
    """Why a JSON schema asks for too many repetitions or is nested too deep (None: fine)."""
    if depth > 64:
        return "the JSON schema is nested too deeply (at most 64 levels)"
    if isinstance(schema, dict):
        for k in _SCHEMA_COUNTS:
            v = schema.get(k)
            if isinstance(v, int | float) and not isinstance(v, bool) and not 0 <= v <= MAX_REPEAT:
                return f"the JSON schema's {k} must be 0 to {MAX_REPEAT}"
        pattern = schema.get("pattern")
        if isinstance(pattern, str) and (got := repeat_problem(pattern)):
            return got
        children = list(schema.values())
    elif isinstance(schema, list):
        children = schema
    else:
        return None
    for child in children:
        if isinstance(child, dict | list) and (got := schema_problem(child, depth + 1)):
            return got
    return None


class StructuredOutput(BaseModel):
    """What the output must match; ``json`` is a JSON schema (an object, or its JSON text)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, serialize_by_alias=True)
    json_schema: dict[str, Any] | None = Field(default=None, alias="json")
    regex: str | None = Field(default=None, max_length=MAX_REGEX_CHARS)
    choice: list[str] | None = Field(default=None, min_length=1, max_length=4096)
    grammar: str | None = Field(default=None, max_length=MAX_GRAMMAR_CHARS)  # Lark or GBNF
    json_object: bool | None = None  # any JSON object

    @field_validator("json_schema", mode="before")
    @classmethod
    def _schema_text(cls, v: Any) -> Any:
        if isinstance(v, str):
            try:
                v = json.loads(v)
            except ValueError:
                raise ValueError("json must be a JSON schema (an object or its JSON text)") from None
        if isinstance(v, bool):  # JSON Schema's true / false schemas
            v = {} if v else {"not": {}}
        if isinstance(v, dict) and len(json.dumps(v)) > MAX_GRAMMAR_CHARS:
            raise ValueError("the JSON schema is too large (at most 1 MiB)")
        return v

    @model_validator(mode="after")
    def _exactly_one(self) -> StructuredOutput:
        given = [self.json_schema is not None, self.regex is not None, self.choice is not None]
        given += [self.grammar is not None, bool(self.json_object)]
        if sum(given) != 1:
            raise ValueError("give exactly one of json, regex, choice, grammar, json_object")
        problem = (
            (self.regex is not None and repeat_problem(self.regex))
            or (
                self.grammar is not None
                and (repeat_problem(self.grammar, True) or repeat_problem(self.grammar))
            )
            or (self.json_schema is not None and schema_problem(self.json_schema))
        )
        if problem:
            raise ValueError(problem)
        try:  # the grammar engine takes UTF-8: no lone surrogates anywhere
            json.dumps(self.model_dump(exclude_none=True), ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("the constraint must be valid Unicode (no lone surrogates)") from None
        return self

    def key(self) -> str:
        """The constraint as compact JSON (the grammar caches' key). Key order is kept: a
        schema's property order is the order the output writes them in."""
        return json.dumps(self.model_dump(exclude_none=True), separators=(",", ":"))


class FunctionSpec(BaseModel):
    model_config = ConfigDict(extra="allow")  # e.g. "strict": kept for the chat template
    name: str = Field(min_length=1, max_length=256, pattern=r"^[A-Za-z0-9_.:-]+$")
    description: str | None = Field(default=None, max_length=65536)
    parameters: dict[str, Any] | None = None

    @field_validator("parameters")
    @classmethod
    def _bounded(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None and (problem := schema_problem(v)):
            raise ValueError(problem)
        return v


class Tool(BaseModel):
    """A tool the model may call (OpenAI's ``tools`` item), passed to the chat template."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["function"] = "function"
    function: FunctionSpec


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=256)
    arguments: str = Field(default="{}", max_length=MAX_GRAMMAR_CHARS)  # JSON text, as OpenAI sends it


class ToolCall(BaseModel):
    """A call an assistant message made (input history, or parsed from the output)."""

    model_config = ConfigDict(extra="forbid")
    id: str = Field(default="", max_length=256)
    type: Literal["function"] = "function"
    function: FunctionCall
