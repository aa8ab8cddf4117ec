"""OpenAI responses and stream chunks built from job results (one job per choice)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from gateway.logprobs import chat_logprobs, completion_logprobs
from gateway.tools import ToolOutput
from shared.schemas import FinishEvent, FinishReason, Logprobs, Speculation, StartEvent, TokenEvent


def spec_field(spec: Speculation) -> dict[str, Any]:
    """A chunk's ``nightjar`` field: ``spans``, its generated text cut where the token that
    produced it changes, each marked ``drafted`` (an accepted draft), false (the target's own
    token) or null (produced by an earlier attempt of a job taken over after a failure), with
    the token's position in the output; ``steps``, the engine steps whose tokens the chunk
    carries: ``tokens`` emitted, ``accepted`` drafts of ``drafted`` proposed by ``drafter``
    with ``gamma`` asked for."""
    return {
        "spans": [s.model_dump(mode="json") for s in spec.spans],
        "steps": [s.model_dump(mode="json") for s in spec.steps],
    }


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
    the prompt text echoed before its completion (completions with ``echo``; None for a
    token-id prompt: its tokens' texts from its prompt logprobs, joined). Logprobs are
    shown where the jobs' events carry them (gateway/logprobs.py); ``prompt_logprobs``: the
    echoed prompts' come from the workers, so a stream's echo chunk waits for them;
    ``echo_only`` (``max_tokens: 0`` with ``echo``): the choice is its prompt alone;
    ``spec`` (``stream_options.include_spec``): a token event's chunk carries its speculation
    facts as ``nightjar`` (``spec_field``), a field OpenAI's clients ignore."""

    def __init__(
        self,
        chat: bool,
        job_id: str,
        model: str,
        include_usage: bool = False,
        *,
        continuous_usage: bool = False,
        prompt_of: Sequence[int] | None = None,
        echo: Sequence[str | None] | None = None,
        prompt_logprobs: bool = False,
        echo_only: bool = False,
        tools: ToolOutput | None = None,
        spec: bool = False,
    ) -> None:
        self.chat = chat
        self.spec = spec
        self.id = ("chatcmpl-" if chat else "cmpl-") + job_id
        self.model = model
        self.created = int(time.time())
        self.include_usage = include_usage
        self.continuous_usage = continuous_usage
        self.prompt_of = list(prompt_of) if prompt_of is not None else [0]
        self.echo = list(echo) if echo is not None else []
        self.prompt_logprobs = prompt_logprobs
        self.echo_only = echo_only
        self._echo_sent: set[int] = set()
        self._offsets: dict[int, int] = {}  # a streamed choice's text offset so far
        self.tools = tools  # chat with tools: tool calls parsed out of the text (gateway/tools.py)
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

    def _echo_text(self, index: int, prompt: Logprobs | None) -> str:
        """Choice ``index``'s echoed prompt: its text, or a token-id prompt's tokens' texts."""
        given = self.echo[index] if index < len(self.echo) else ""
        if given is not None:
            return given
        return "".join(prompt.tokens) if prompt is not None else ""

    def full(self, finals: FinishEvent | Sequence[FinishEvent]) -> dict[str, Any]:
        items = self._views(finals)
        choices = []
        for i, final in enumerate(items):
            choice: dict[str, Any] = {
                "index": i,
                "logprobs": self._choice_logprobs(i, final),
                "finish_reason": final.finish_reason,
            }
            if self.chat and self.tools is not None:
                choice["message"], choice["finish_reason"] = self.tools.message(
                    i, final.text, final.finish_reason
                )
            elif self.chat:
                choice["message"] = {"role": "assistant", "content": final.text}
            else:
                choice["text"] = self._echo_text(i, final.prompt_logprobs) + final.text
            choices.append(choice)
        body = self._envelope("chat.completion" if self.chat else "text_completion", choices)
        body["usage"] = usage(items, self.prompt_of)
        return body

    def observe(self, index: int, ev: object) -> None:
        """Count what a choice's event says about its usage (continuous usage stats)."""
        if isinstance(ev, StartEvent):
            self._prompt_tokens[index] = ev.prompt_tokens
        elif isinstance(ev, TokenEvent) and not self.echo_only:
            self._completion_tokens[index] = max(
                self._completion_tokens.get(index, 0), ev.index + len(ev.token_ids)
            )
        elif isinstance(ev, FinishEvent):
            self._prompt_tokens[index] = ev.prompt_tokens
            self._completion_tokens[index] = 0 if self.echo_only else ev.completion_tokens

    def _usage_so_far(self) -> dict[str, int]:
        prompts: dict[int, int] = {}
        for i, n in self._prompt_tokens.items():
            prompts.setdefault(self.prompt_of[i] if i < len(self.prompt_of) else 0, n)
        p, c = sum(prompts.values()), sum(self._completion_tokens.values())
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    def chunk(
        self,
        text: str,
        finish_reason: str | None = None,
        index: int = 0,
        logprobs: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": index, "logprobs": logprobs, "finish_reason": finish_reason}
        if self.chat:
            calls: list[dict[str, Any]] = []
            if self.tools is not None:  # what may be a tool call is held back, the calls sent whole
                text, calls, finish_reason = self.tools.step(index, text, finish_reason)
                choice["finish_reason"] = finish_reason
            delta: dict[str, Any] = {} if finish_reason and not text else {"content": text}
            if calls:
                delta["tool_calls"] = calls
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
        """The echoed prompt of a choice, as its first chunk (completions with echo); None
        too while it waits for its prompt's logprobs (``token_chunks`` sends it then)."""
        text = self.echo[index] if index < len(self.echo) else None
        if not text or self.prompt_logprobs:
            return None
        return self.chunk(text, None, index)

    def usage_chunk(self, finals: FinishEvent | Sequence[FinishEvent]) -> dict[str, Any]:
        body = self._envelope(self.kind, [])
        body["usage"] = usage(self._views(finals), self.prompt_of)
        return body

    # ------------------------------------------------------------------ logprobs, echo

    def _views(self, finals: FinishEvent | Sequence[FinishEvent]) -> list[FinishEvent]:
        """The final events as the choices show them: with ``echo_only``, no output at all."""
        items = [finals] if isinstance(finals, FinishEvent) else list(finals)
        if not self.echo_only:
            return items
        empty = {"text": "", "token_ids": [], "completion_tokens": 0, "finish_reason": FinishReason.LENGTH}
        return [f.model_copy(update={**empty, "logprobs": f.logprobs and Logprobs()}) for f in items]

    def _echoes(self, index: int) -> bool:
        return index < len(self.echo)

    def _choice_logprobs(self, index: int, final: FinishEvent) -> dict[str, Any] | None:
        """A whole choice's logprobs: the echoed prompt's, then the output's."""
        prompt = final.prompt_logprobs if self._echoes(index) else None
        if final.logprobs is None and prompt is None:
            return None
        lp = Logprobs.join([x for x in (prompt, final.logprobs) if x is not None])
        return chat_logprobs(lp) if self.chat else completion_logprobs(lp)[0]

    def _render(self, index: int, lp: Logprobs | None) -> dict[str, Any] | None:
        """One chunk's logprobs (a completion's text offsets go on from the last chunk's)."""
        if lp is None:
            return None
        if self.chat:
            return chat_logprobs(lp)
        body, self._offsets[index] = completion_logprobs(lp, self._offsets.get(index, 0))
        return body

    def _pending_echo(self, index: int, prompt: Logprobs | None) -> list[dict[str, Any]]:
        """The echo chunk that waited for its prompt's logprobs, once."""
        if not (self.prompt_logprobs and self._echoes(index)) or index in self._echo_sent:
            return []
        self._echo_sent.add(index)
        return [self.chunk(self._echo_text(index, prompt), None, index, self._render(index, prompt))]

    def token_chunks(self, index: int, ev: TokenEvent) -> list[dict[str, Any]]:
        """The chunks of a token event: its text and logprobs (none while both are empty),
        after the echo that waited for the prompt's logprobs."""
        out = self._pending_echo(index, ev.prompt_logprobs)
        if not self.echo_only and (ev.text or ev.logprobs or (self.spec and ev.token_ids)):
            body = self.chunk(ev.text, None, index, self._render(index, ev.logprobs))
            if self.spec and ev.spec is not None:
                body["nightjar"] = spec_field(ev.spec)
            out.append(body)
        return out

    def finish_chunks(self, index: int, ev: FinishEvent) -> list[dict[str, Any]]:
        """A choice's last chunk (its finish reason), after an echo still waiting."""
        reason = FinishReason.LENGTH if self.echo_only else ev.finish_reason
        return [*self._pending_echo(index, ev.prompt_logprobs), self.chunk("", reason, index)]
