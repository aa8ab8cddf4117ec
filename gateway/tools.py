"""Tool calling on /v1/chat/completions: ``tools`` + ``tool_choice`` → what the job runs, and
the tool calls in its output.

- ``"none"``: as if no tools were given.
- ``"auto"`` (the default with tools): the tools go to the chat template; Hermes-style
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks in the output become
  ``message.tool_calls`` (finish_reason ``"tool_calls"``), the rest stays ``content``.
- ``"required"`` / ``{"type": "function", "function": {"name"}}``: the output is constrained
  (a grammar, shared/grammar.py) to such blocks of the given function(s), arguments matching
  their ``parameters`` schema; several with ``parallel_tool_calls`` (the default), one without.

Streaming: text that could begin a ``<tool_call>`` is held back; the calls come whole in the
choice's last chunk, one ``tool_calls`` delta (never as partial arguments).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from gateway.errors import APIError
from shared.errors import ErrorCode
from shared.grammar import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, tool_call_grammar
from shared.structured import MAX_TOOLS, StructuredOutput, Tool

_BLOCK = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)(?:" + re.escape(TOOL_CALL_CLOSE) + r"|$)", re.DOTALL)


def _bad(message: str, param: str) -> APIError:
    return APIError.of(ErrorCode.BAD_REQUEST, message, param=param)


@dataclass(frozen=True)
class ToolChoice:
    """The request's tools (for the template) and what it asks of them: ``forced``, output
    constrained to calls of ``allowed``."""

    tools: list[Tool]
    allowed: list[Tool]
    forced: bool
    parallel: bool

    def grammar(self) -> StructuredOutput | None:
        return tool_call_grammar(self.allowed, self.parallel) if self.forced else None


def check_tools(tools: list[Any] | None, choice: Any, parallel: bool | None) -> ToolChoice | None:
    """The checked ``tools`` / ``tool_choice`` (400 naming the parameter), None when off."""
    if choice is not None and not isinstance(choice, str | dict):
        raise _bad("tool_choice must be 'none', 'auto', 'required' or a named function", "tool_choice")
    if not tools:
        if choice not in (None, "none", "auto"):
            raise _bad("tool_choice needs tools", "tool_choice")
        return None
    if len(tools) > MAX_TOOLS:
        raise _bad(f"at most {MAX_TOOLS} tools", "tools")
    try:
        checked = [Tool.model_validate(t) for t in tools]
    except ValidationError as exc:
        raise _bad(
            f"each tool must be {{'type': 'function', 'function': {{'name', ...}}}}: {exc}", "tools"
        ) from None
    for t in checked:
        if t.function.parameters is not None and not isinstance(t.function.parameters, dict):
            raise _bad("a function's parameters must be a JSON schema object", "tools")
    if choice == "none":
        return None
    if choice in (None, "auto", "required"):
        return ToolChoice(checked, checked, choice == "required", parallel is not False)
    if isinstance(choice, dict):
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        named = [t for t in checked if t.function.name == name]
        if choice.get("type") != "function" or not named:
            raise _bad("tool_choice names no function of tools", "tool_choice")
        return ToolChoice(checked, named, True, False)
    raise _bad("tool_choice must be 'none', 'auto', 'required' or a named function", "tool_choice")


def parse(text: str, call_id: str) -> tuple[str, list[dict[str, Any]]]:
    """The text outside tool-call blocks and the calls (OpenAI's shape) in ``text``; no
    calls (and the text unchanged) unless every block is a JSON object with a ``name``."""
    calls: list[dict[str, Any]] = []
    for k, m in enumerate(_BLOCK.finditer(text)):
        try:
            obj = json.loads(m.group(1).strip())
        except ValueError:
            return text, []
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return text, []
        args = obj.get("arguments", obj.get("parameters", {}))
        arguments = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        digest = hashlib.sha256(f"{call_id}:{k}".encode()).hexdigest()[:24]
        calls.append(
            {
                "id": f"call_{digest}",
                "type": "function",
                "function": {"name": obj["name"], "arguments": arguments},
            }
        )
    return (_BLOCK.sub("", text), calls) if calls else (text, [])


def _held_back(text: str, forced: bool) -> int:
    """How much of ``text`` may stream as content: everything before a (possible) block."""
    if forced:
        return 0
    at = text.find(TOOL_CALL_OPEN)
    if at >= 0:
        return at
    for k in range(min(len(TOOL_CALL_OPEN) - 1, len(text)), 0, -1):
        if text.endswith(TOOL_CALL_OPEN[:k]):
            return len(text) - k
    return len(text)


@dataclass
class ToolOutput:
    """Tool calls in the choices of one response (``base``: the response id)."""

    choice: ToolChoice
    base: str
    _text: dict[int, str] = field(default_factory=dict)
    _sent: dict[int, int] = field(default_factory=dict)

    def message(self, index: int, text: str, finish_reason: str) -> tuple[dict[str, Any], str]:
        """A whole choice's message and finish reason."""
        content, calls = parse(text, f"{self.base}:{index}")
        if not calls:
            return {"role": "assistant", "content": text}, finish_reason
        return {"role": "assistant", "content": content.strip() or None, "tool_calls": calls}, "tool_calls"

    def step(
        self, index: int, text: str, finish_reason: str | None
    ) -> tuple[str, list[dict[str, Any]], str | None]:
        """A streamed chunk's content to send now, its tool calls (in the last chunk) and
        finish reason."""
        full = self._text[index] = self._text.get(index, "") + text
        sent = self._sent.get(index, 0)
        if finish_reason is None:
            safe = max(sent, _held_back(full, self.choice.forced))
            self._sent[index] = safe
            return full[sent:safe], [], None
        content, calls = parse(full, f"{self.base}:{index}")
        if not calls:
            return full[sent:], [], finish_reason
        rest = content[sent:] if content[sent:].strip() else ""
        return rest, [{"index": k, **c} for k, c in enumerate(calls)], "tool_calls"
