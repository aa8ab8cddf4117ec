"""gateway.tools: tools / tool_choice checked into what the job runs; tool calls parsed out
of the text, whole and streamed (held back until the end, sent in one delta)."""

from __future__ import annotations

import json

import pytest

from gateway.errors import APIError
from gateway.tools import ToolOutput, check_tools, parse

WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CLOCK = {"type": "function", "function": {"name": "clock"}}
CALL = '<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def test_choices() -> None:
    assert check_tools(None, None, None) is None and check_tools([WEATHER], "none", None) is None
    auto = check_tools([WEATHER, CLOCK], None, None)
    assert auto is not None and not auto.forced and auto.grammar() is None
    required = check_tools([WEATHER, CLOCK], "required", False)
    assert required is not None and required.forced and not required.parallel
    grammar = required.grammar()
    assert grammar is not None and grammar.grammar is not None and "clock" in grammar.grammar
    named = check_tools([WEATHER, CLOCK], {"type": "function", "function": {"name": "clock"}}, None)
    assert named is not None and [t.function.name for t in named.allowed] == ["clock"]
    assert [t.function.name for t in named.tools] == ["weather", "clock"]  # the template sees all


@pytest.mark.parametrize(
    ("tools", "choice", "param"),
    [
        (None, "required", "tool_choice"),
        ([{}], None, "tools"),
        ([{"type": "function", "function": {"name": "a b"}}], None, "tools"),
        ([WEATHER], {"type": "function", "function": {"name": "nope"}}, "tool_choice"),
        ([WEATHER], "sometimes", "tool_choice"),
        ([WEATHER], 3, "tool_choice"),
    ],
)
def test_refused(tools: list | None, choice: object, param: str) -> None:
    with pytest.raises(APIError) as err:
        check_tools(tools, choice, None)
    assert err.value.status == 400 and err.value.param == param


def test_parse() -> None:
    content, calls = parse(f"Let me look.\n{CALL}", "x:0")
    assert content.strip() == "Let me look."
    (call,) = calls
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "weather", "arguments": json.dumps({"city": "Paris"})}
    assert parse(f"{CALL}\n{CALL}", "x:0")[1][1]["id"] != call["id"]  # ids differ per call
    assert parse(CALL, "x:0")[1][0]["id"] == call["id"]  # and are stable per response
    assert parse("no calls here", "x") == ("no calls here", [])
    broken = "<tool_call>{not json</tool_call>"
    assert parse(broken, "x") == (broken, [])
    unclosed = '<tool_call>{"name": "clock", "arguments": {}}'
    assert parse(unclosed, "x")[1][0]["function"] == {"name": "clock", "arguments": "{}"}


def test_message_and_stream() -> None:
    choice = check_tools([WEATHER], "auto", None)
    assert choice is not None
    out = ToolOutput(choice, "chatcmpl-1")
    message, reason = out.message(0, f"Sure. {CALL}", "stop")
    assert reason == "tool_calls" and message["content"] == "Sure." and len(message["tool_calls"]) == 1
    assert out.message(1, "just text", "length") == ({"role": "assistant", "content": "just text"}, "length")

    pieces = ["Sure. <to", 'ol_call>\n{"name": ', '"weather", "arguments": {"city": "Paris"}}\n</tool_call>']
    sent = [out.step(0, p, None) for p in pieces]
    assert [s[0] for s in sent] == ["Sure. ", "", ""]  # a possible call is held back
    last = out.step(0, "", "stop")
    calls = last[1]
    assert last[0] == "" and last[2] == "tool_calls"
    assert calls == [{"index": 0, **parse(f"Sure. {CALL}", "chatcmpl-1:0")[1][0]}]
    # Text that turns out not to be a call is sent at the end.
    assert out.step(1, "a <tool", None)[0] == "a "
    assert out.step(1, "box>", "stop") == ("<toolbox>", [], "stop")


def test_forced_output_is_all_held_back() -> None:
    choice = check_tools([WEATHER], "required", None)
    assert choice is not None
    out = ToolOutput(choice, "c")
    assert out.step(0, CALL[:20], None) == ("", [], None)
    text, calls, reason = out.step(0, CALL[20:], "stop")
    assert (text, reason) == ("", "tool_calls") and calls[0]["function"]["name"] == "weather"
