"""OpenAI chat messages as the worker's ChatMessage: a ``developer`` message is a system one,
text content parts are joined, an assistant's ``tool_calls`` and a tool's ``tool_call_id`` are
kept (arguments given as an object are serialised to the JSON string OpenAI sends)."""

from __future__ import annotations

import json
from typing import Any

from shared.schemas import ChatMessage


def chat_message(m: dict[str, Any]) -> ChatMessage:
    """An OpenAI message (string content or text parts; an assistant's ``tool_calls``, a
    tool's ``tool_call_id``) as a ChatMessage."""
    role = "system" if m.get("role") == "developer" else m.get("role")
    content = m.get("content")
    if isinstance(content, list):
        if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
            raise ValueError("only text content parts are supported")
        content = "".join(str(p.get("text", "")) for p in content)
    calls = m.get("tool_calls") if role == "assistant" else None
    if content is None and calls:
        content = ""
    if role not in ("system", "user", "assistant", "tool") or not isinstance(content, str):
        raise ValueError("each message needs a role (system, user, assistant, tool) and text content")
    fields: dict[str, Any] = {"role": role, "content": content}
    if calls:
        if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
            raise ValueError("tool_calls must be a list of tool calls")
        fields["tool_calls"] = [_tool_call(c) for c in calls]
    if role == "tool":
        if not isinstance(m.get("tool_call_id"), str):
            raise ValueError("a tool message needs the tool_call_id it answers")
        fields["tool_call_id"] = m["tool_call_id"]
    if isinstance(m.get("name"), str):
        fields["name"] = m["name"]
    return ChatMessage.model_validate(fields)


def _tool_call(c: dict[str, Any]) -> dict[str, Any]:
    fn: dict[str, Any] = c["function"] if isinstance(c.get("function"), dict) else {}
    args = fn.get("arguments", "{}")
    return {
        "id": c.get("id") or "",
        "type": "function",
        "function": {
            "name": fn.get("name"),
            "arguments": args if isinstance(args, str) else json.dumps(args),
        },
    }
