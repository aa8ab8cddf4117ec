"""Structured output and tools through the official ``openai`` SDK, unchanged, against the
real gateway and a worker serving a tiny random model: its text is gibberish, but the
grammar still makes it valid JSON of the schema, and forced tool calls parse."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel

from tests.compat.serving import sdk, served

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.anyio

WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"enum": ["Paris", "Rome"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}


class Answer(BaseModel):
    city: Literal["Paris", "Rome", "Oslo"]
    sunny: bool


async def _check(client: openai.AsyncOpenAI, name: str) -> None:
    msgs = [{"role": "user", "content": "Which city, and is it sunny?"}]
    # response_format json_schema, through the SDK's own parse helper (a strict schema).
    parsed = await client.chat.completions.parse(
        model=name,
        messages=msgs,
        response_format=Answer,
        max_tokens=160,
        temperature=0,  # type: ignore[arg-type]
    )
    answer = parsed.choices[0].message.parsed
    assert isinstance(answer, Answer) and parsed.choices[0].finish_reason == "stop"
    # json_object, sampled: any JSON object.
    obj = await client.chat.completions.create(
        model=name,
        messages=msgs,  # type: ignore[arg-type]
        response_format={"type": "json_object"},
        max_tokens=200,
        temperature=0.8,
        seed=3,
        extra_body={"guided_whitespace_pattern": None},
    )
    if obj.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(obj.choices[0].message.content or ""), dict)
    # tool_choice required: the call parses, its arguments match the function's schema.
    called = await client.chat.completions.create(
        model=name,
        messages=msgs,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=160,
        temperature=0,
    )
    choice = called.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "weather"  # type: ignore[union-attr]
    args = json.loads(call.function.arguments)  # type: ignore[union-attr]
    assert args["city"] in ("Paris", "Rome") and 1 <= args["days"] <= 7
    # The same, streamed: the call arrives whole in the last delta; then the conversation goes
    # on with the call and its result in the history.
    stream = await client.chat.completions.create(
        model=name,
        messages=msgs,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "weather"}},
        max_tokens=160,
        temperature=0,
        stream=True,
    )
    deltas = [c.choices[0] async for c in stream if c.choices]
    assert deltas[-1].finish_reason == "tool_calls"
    (streamed,) = deltas[-1].delta.tool_calls or []
    assert streamed.function is not None and streamed.function.arguments == call.function.arguments  # type: ignore[union-attr]
    history = [
        *msgs,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"},
    ]
    after = await client.chat.completions.create(
        model=name,
        messages=history,
        tools=[WEATHER],
        max_tokens=8,
        temperature=0,  # type: ignore[arg-type, list-item]
    )
    assert after.choices[0].finish_reason in ("stop", "length", "tool_calls")
    # A schema the grammar engine refuses is a typed 400 naming the parameter.
    with pytest.raises(openai.BadRequestError) as bad:
        await client.chat.completions.create(
            model=name,
            messages=msgs,  # type: ignore[arg-type]
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}},
        )
    assert bad.value.param == "response_format"  # type: ignore[attr-defined]


async def test_structured_output_and_tools_through_the_openai_sdk(model_dir: Path) -> None:
    async with served(model_dir) as base:
        client = sdk(base)
        try:
            await _check(client, model_dir.name)
        finally:
            await client.close()
