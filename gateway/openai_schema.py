"""OpenAI-compatible request bodies and the responses and stream chunks built from results.

Unsupported OpenAI features (n > 1, logprobs, echo, penalties) are refused with a 400
naming the parameter rather than silently ignored. Extensions: top_k, ignore_eos, priority.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gateway.errors import APIError, from_validation
from shared.errors import ErrorCode
from shared.schemas import INT32_MAX, ChatMessage, FinishEvent, SamplingParams


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1, le=1, description="only 1 is supported")
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=0, lt=2**63)
    user: str | None = None
    presence_penalty: float = Field(default=0.0, ge=0.0, le=0.0, description="not supported")
    frequency_penalty: float = Field(default=0.0, ge=0.0, le=0.0, description="not supported")
    top_k: int = Field(default=0, ge=0, le=INT32_MAX)
    ignore_eos: bool = False
    priority: int = Field(default=0, ge=-INT32_MAX, le=INT32_MAX)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def sampling(self, max_tokens: int) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        try:
            return SamplingParams(
                max_tokens=max_tokens,
                temperature=self.temperature,
                top_p=self.top_p,
                top_k=self.top_k,
                seed=self.seed,
                stop=stop,
                ignore_eos=self.ignore_eos,
            )
        except ValidationError as exc:
            raise from_validation(exc) from None


class CompletionRequest(_Common):
    prompt: str | list[int] | list[str]
    echo: Literal[False] = False
    logprobs: None = None
    suffix: None = None

    def prompt_input(self) -> dict[str, Any]:
        """The JobRequest input field for this prompt."""
        p = self.prompt
        if isinstance(p, str):
            return {"prompt": p}
        if not p:
            raise APIError.of(ErrorCode.BAD_REQUEST, "prompt must not be empty", param="prompt")
        if all(isinstance(x, str) for x in p):
            if len(p) != 1:
                raise APIError.of(
                    ErrorCode.BAD_REQUEST, "only one prompt per request is supported", param="prompt"
                )
            return {"prompt": p[0]}
        return {"prompt_token_ids": list(p)}


class ChatRequest(_Common):
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)
    logprobs: Literal[False] = False

    @field_validator("messages")
    @classmethod
    def _text_only(cls, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for m in messages:
            chat_message(m)  # raises ValueError with a readable message
        return messages

    def chat_messages(self) -> list[ChatMessage]:
        return [chat_message(m) for m in self.messages]


def chat_message(m: dict[str, Any]) -> ChatMessage:
    """An OpenAI message (string content or text parts) as a ChatMessage."""
    role = "system" if m.get("role") == "developer" else m.get("role")
    content = m.get("content")
    if isinstance(content, list):
        if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
            raise ValueError("only text content parts are supported")
        content = "".join(str(p.get("text", "")) for p in content)
    if role not in ("system", "user", "assistant") or not isinstance(content, str):
        raise ValueError("each message needs a role (system, user, assistant) and text content")
    return ChatMessage.model_validate({"role": role, "content": content})


def usage(final: FinishEvent) -> dict[str, int]:
    return {
        "prompt_tokens": final.prompt_tokens,
        "completion_tokens": final.completion_tokens,
        "total_tokens": final.prompt_tokens + final.completion_tokens,
    }


class ResponseBuilder:
    """Builds the response or stream chunks of one completion (text or chat)."""

    def __init__(self, chat: bool, job_id: str, model: str, include_usage: bool = False) -> None:
        self.chat = chat
        self.id = ("chatcmpl-" if chat else "cmpl-") + job_id
        self.model = model
        self.created = int(time.time())
        self.include_usage = include_usage
        self._sent_role = False

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def full(self, final: FinishEvent) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": final.finish_reason}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": final.text}
        else:
            choice["text"] = final.text
        body = self._envelope("chat.completion" if self.chat else "text_completion", [choice])
        body["usage"] = usage(final)
        return body

    def chunk(self, text: str, finish_reason: str | None = None) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish_reason}
        if self.chat:
            delta: dict[str, Any] = {} if finish_reason and not text else {"content": text}
            if not self._sent_role:
                delta["role"] = "assistant"
                self._sent_role = True
            choice["delta"] = delta
        else:
            choice["text"] = text
        body = self._envelope("chat.completion.chunk" if self.chat else "text_completion", [choice])
        if self.include_usage:
            body["usage"] = None
        return body

    def usage_chunk(self, final: FinishEvent) -> dict[str, Any]:
        body = self._envelope("chat.completion.chunk" if self.chat else "text_completion", [])
        body["usage"] = usage(final)
        return body
