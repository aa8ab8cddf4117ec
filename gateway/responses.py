"""OpenAI responses and stream chunks built from job results (one job per choice)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from shared.schemas import FinishEvent, StartEvent, TokenEvent


def usage(
    finals: FinishEvent | Sequence[FinishEvent], prompt_of: Sequence[int] | None = None
) -> dict[str, int]:
    """Usage of the choices: each prompt counted once (its choices share it), every
    completion counted."""
    items = [finals] if isinstance(finals, FinishEvent) else list(finals)
    prompts: dict[int, int] = {}
    for i, f in enumerate(items):
        prompts.setdefault(prompt_of[i] if prompt_of is not None else 0, f.prompt_tokens)
    p = sum(prompts.values())
    c = sum(f.completion_tokens for f in items)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


class ResponseBuilder:
    """Builds the response or the stream chunks of one request (text or chat), whose
    choices are jobs ``0 .. choices-1``; ``prompt_of[i]`` is choice i's prompt, ``echo[i]``
    the prompt text echoed before its completion (completions with ``echo``)."""

    def __init__(
        self,
        chat: bool,
        job_id: str,
        model: str,
        include_usage: bool = False,
        *,
        continuous_usage: bool = False,
        prompt_of: Sequence[int] | None = None,
        echo: Sequence[str] | None = None,
    ) -> None:
        self.chat = chat
        self.id = ("chatcmpl-" if chat else "cmpl-") + job_id
        self.model = model
        self.created = int(time.time())
        self.include_usage = include_usage
        self.continuous_usage = continuous_usage
        self.prompt_of = list(prompt_of) if prompt_of is not None else [0]
        self.echo = list(echo) if echo is not None else []
        self._sent_role: set[int] = set()
        self._prompt_tokens: dict[int, int] = {}
        self._completion_tokens: dict[int, int] = {}

    @property
    def kind(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def _echoed(self, index: int, text: str) -> str:
        return (self.echo[index] if index < len(self.echo) else "") + text

    def full(self, finals: FinishEvent | Sequence[FinishEvent]) -> dict[str, Any]:
        items = [finals] if isinstance(finals, FinishEvent) else list(finals)
        choices = []
        for i, final in enumerate(items):
            choice: dict[str, Any] = {"index": i, "logprobs": None, "finish_reason": final.finish_reason}
            if self.chat:
                choice["message"] = {"role": "assistant", "content": final.text}
            else:
                choice["text"] = self._echoed(i, final.text)
            choices.append(choice)
        body = self._envelope("chat.completion" if self.chat else "text_completion", choices)
        body["usage"] = usage(items, self.prompt_of)
        return body

    def observe(self, index: int, ev: object) -> None:
        """Count what a choice's event says about its usage (continuous usage stats)."""
        if isinstance(ev, StartEvent):
            self._prompt_tokens[index] = ev.prompt_tokens
        elif isinstance(ev, TokenEvent):
            self._completion_tokens[index] = max(
                self._completion_tokens.get(index, 0), ev.index + len(ev.token_ids)
            )
        elif isinstance(ev, FinishEvent):
            self._prompt_tokens[index] = ev.prompt_tokens
            self._completion_tokens[index] = ev.completion_tokens

    def _usage_so_far(self) -> dict[str, int]:
        prompts: dict[int, int] = {}
        for i, n in self._prompt_tokens.items():
            prompts.setdefault(self.prompt_of[i] if i < len(self.prompt_of) else 0, n)
        p, c = sum(prompts.values()), sum(self._completion_tokens.values())
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    def chunk(self, text: str, finish_reason: str | None = None, index: int = 0) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": index, "logprobs": None, "finish_reason": finish_reason}
        if self.chat:
            delta: dict[str, Any] = {} if finish_reason and not text else {"content": text}
            if index not in self._sent_role:
                delta["role"] = "assistant"
                self._sent_role.add(index)
            choice["delta"] = delta
        else:
            choice["text"] = text
        body = self._envelope(self.kind, [choice])
        if self.continuous_usage:
            body["usage"] = self._usage_so_far()
        elif self.include_usage:
            body["usage"] = None
        return body

    def echo_chunk(self, index: int) -> dict[str, Any] | None:
        """The echoed prompt of a choice, as its first chunk (completions with echo)."""
        if index >= len(self.echo) or not self.echo[index]:
            return None
        return self.chunk(self.echo[index], None, index)

    def usage_chunk(self, finals: FinishEvent | Sequence[FinishEvent]) -> dict[str, Any]:
        body = self._envelope(self.kind, [])
        body["usage"] = usage(finals, self.prompt_of)
        return body
