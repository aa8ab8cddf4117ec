"""OpenAI-compatible request bodies (/v1/completions, /v1/chat/completions).

As vLLM does, a field this server does not know is ignored and logged once per field name,
so clients that send newer or vendor fields (``store``, ``service_tier``, ...) work. vLLM's
common extensions are accepted: ``top_k``, ``min_tokens``, ``repetition_penalty``,
``stop_token_ids``, ``ignore_eos``, ``priority``, ``stream_options.continuous_usage_stats``;
and Nightjar's ``stream_options.include_spec`` (each chunk's ``nightjar`` field: which of its
tokens were accepted drafts, each step's drafter and γ).
A known feature that this server cannot honour (``best_of``, ``suffix``) is a 400 naming the
parameter, never silently dropped. Structured output — ``response_format`` ``json_object`` /
``json_schema``, vLLM's ``guided_json`` / ``guided_regex`` / ``guided_choice`` /
``guided_grammar`` and ``structured_outputs`` — becomes ``SamplingParams.structured``, a
constraint the gateway has the grammar engine check first (400 when it refuses); tools are in
gateway/tools.py.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gateway import constraints
from gateway.chat_messages import chat_message
from gateway.errors import APIError, from_validation
from gateway.tools import ToolChoice, ToolOutput, check_tools
from shared.errors import ErrorCode
from shared.schemas import (
    INT32_MAX,
    MAX_LOGPROBS,
    MAX_REPETITION_PENALTY,
    MAX_TOKEN_ID,
    MIN_REPETITION_PENALTY,
    ChatMessage,
    SamplingParams,
    valid_text,
)
from shared.structured import StructuredOutput, Tool

__all__ = ["ChatRequest", "CompletionRequest", "check_processors"]

log = logging.getLogger("nightjar.gateway")
MAX_N = 128  # choices per request (n × prompts), each one job
MAX_PROMPTS = 256
# The logits processors and outputs the engine honours (worker/engine); a request asking for
# another is refused by name rather than run without it.
ENGINE_PROCESSORS = frozenset(
    {"presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "min_tokens", "logprobs"}
)  # worker/engine/processors.py; logprobs: worker/engine/logprobs.py
_logged: set[str] = set()
_logged_lock = threading.Lock()


def ignored(fields: list[str]) -> None:
    """Log each ignored field name once per process (a client sends it on every request)."""
    with _logged_lock:
        new = [f for f in fields if f not in _logged and len(_logged) < 10_000]
        _logged.update(new)
    for f in new:
        log.warning("ignoring unknown request field %r (logged once)", f[:100])


class _Lenient(BaseModel):
    """Unknown fields are accepted, logged once and dropped."""

    model_config = ConfigDict(extra="allow")

    @model_validator(mode="after")
    def _drop_unknown(self) -> _Lenient:
        extra = self.__pydantic_extra__
        if extra:
            ignored([f"{type(self).__name__}.{k}" for k in extra])
            extra.clear()
        return self


class StreamOptions(_Lenient):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM: usage in every chunk
    include_spec: bool = False  # Nightjar: each chunk's "nightjar" field (docs/api.md)


class JsonSchemaFormat(_Lenient):
    name: str | None = Field(default=None, max_length=256)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None  # always strict here: the grammar enforces the schema


class ResponseFormat(_Lenient):
    type: str = "text"
    json_schema: JsonSchemaFormat | None = None

    def structured(self) -> StructuredOutput | None:
        if self.type == "text":
            return None
        if self.type == "json_object":
            return StructuredOutput(json_object=True)
        if self.type == "json_schema":
            if self.json_schema is None or self.json_schema.schema_ is None:
                raise APIError.of(
                    ErrorCode.BAD_REQUEST,
                    "response_format json_schema needs json_schema.schema",
                    param="response_format",
                )
            return StructuredOutput(json=self.json_schema.schema_)
        raise APIError.of(
            ErrorCode.BAD_REQUEST,
            f"response_format {self.type!r} is not supported (text, json_object, json_schema)",
            param="response_format",
        )


class _Common(_Lenient):
    model: str | None = Field(default=None, max_length=256)
    max_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    n: int = Field(default=1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=0, lt=2**63)
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0, allow_inf_nan=False)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0, allow_inf_nan=False)
    repetition_penalty: float = Field(
        default=1.0, ge=MIN_REPETITION_PENALTY, le=MAX_REPETITION_PENALTY, allow_inf_nan=False
    )
    logit_bias: dict[str, float] | None = None
    response_format: ResponseFormat | None = None
    # vLLM's extensions.
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    structured_outputs: dict[str, Any] | None = None  # vLLM's StructuredOutputsParams (json, regex, ...)
    top_k: int = Field(default=0, ge=-1, le=INT32_MAX)  # 0 or -1: no top-k filter
    min_tokens: int = Field(default=0, ge=0, le=32768)
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    priority: int = Field(default=0, ge=-INT32_MAX, le=INT32_MAX)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.continuous_usage_stats)

    @property
    def include_spec(self) -> bool:
        """A stream whose chunks carry their tokens' speculation facts (``nightjar``)."""
        return bool(self.stream and self.stream_options and self.stream_options.include_spec)

    def check_supported(self) -> None:
        """400 for a known feature this server cannot honour yet (named, never dropped), or a
        constraint the grammar engine refuses."""
        params = self.sampling(1)
        check_processors(params)
        constraints.check(params.structured, self.constraint_param())

    def constraint_param(self) -> str:
        """The field the request's constraint came from (for its 400)."""
        given = self._constraints()
        return next(iter(given)) if given else "response_format"

    def _constraints(self) -> dict[str, StructuredOutput]:
        """Every constraint the request gives, by field (at most one is allowed)."""
        fmt = self.response_format.structured() if self.response_format else None
        return constraints.gather(
            fmt,
            self.structured_outputs,
            guided_json=self.guided_json,
            guided_regex=self.guided_regex,
            guided_choice=self.guided_choice,
            guided_grammar=self.guided_grammar,
        )

    def structured(self) -> StructuredOutput | None:
        """The output's constraint: at most one of response_format, guided_*, structured_outputs."""
        return constraints.one(self._constraints())

    def logprobs_k(self) -> int | None:
        return None

    def prompt_logprobs_k(self) -> int | None:
        return None

    def sampling(self, max_tokens: int, seed: int | None = None) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        try:
            bias = {int(k): v for k, v in (self.logit_bias or {}).items()}
        except ValueError:
            raise APIError.of(
                ErrorCode.BAD_REQUEST, "logit_bias keys must be token ids", param="logit_bias"
            ) from None
        try:
            return SamplingParams(
                max_tokens=max_tokens,
                temperature=self.temperature,
                top_p=self.top_p,
                top_k=max(0, self.top_k),
                seed=self.seed if seed is None else seed,
                stop=stop,
                ignore_eos=self.ignore_eos,
                min_tokens=self.min_tokens,
                stop_token_ids=list(self.stop_token_ids or []),
                presence_penalty=self.presence_penalty,
                frequency_penalty=self.frequency_penalty,
                repetition_penalty=self.repetition_penalty,
                logit_bias=bias,
                logprobs=self.logprobs_k(),
                prompt_logprobs=self.prompt_logprobs_k(),
                structured=self.structured(),
            )
        except ValidationError as exc:
            raise from_validation(exc) from None


class CompletionRequest(_Common):
    prompt: Any  # a string, strings, token ids or lists of token ids (checked below)
    max_tokens: int | None = Field(default=None, ge=0, le=INT32_MAX)  # 0: the echoed prompt alone
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    best_of: int | None = Field(default=None, ge=1, le=MAX_N)
    suffix: str | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.best_of is not None and self.best_of != self.n:
            raise APIError.of(
                ErrorCode.BAD_REQUEST,
                "best_of is not supported (vLLM's V1 engine dropped it too): use n and pick a choice",
                param="best_of",
            )
        if self.suffix:
            raise APIError.of(ErrorCode.BAD_REQUEST, "suffix is not supported", param="suffix")
        if self.max_tokens == 0 and not self.echo:
            raise APIError.of(
                ErrorCode.BAD_REQUEST, "max_tokens must be at least 1 (0 only with echo)", param="max_tokens"
            )

    @property
    def echo_only(self) -> bool:
        """``max_tokens: 0`` with ``echo``: the prompt alone, with its logprobs (lm-eval's
        loglikelihood). The job generates one token, which the answer leaves out."""
        return self.echo and self.max_tokens == 0

    def logprobs_k(self) -> int | None:
        return self.logprobs

    def prompt_logprobs_k(self) -> int | None:
        return self.logprobs if self.echo else None

    def prompt_inputs(self) -> list[dict[str, Any]]:
        """The JobRequest input field of each prompt, in order."""
        p = self.prompt
        if isinstance(p, str):
            return [{"prompt": p}]
        if not p:
            raise APIError.of(ErrorCode.BAD_REQUEST, "prompt must not be empty", param="prompt")
        if all(isinstance(x, int) for x in p):
            return [{"prompt_token_ids": list(p)}]
        if len(p) > MAX_PROMPTS:
            raise APIError.of(
                ErrorCode.BAD_REQUEST, f"at most {MAX_PROMPTS} prompts per request", param="prompt"
            )
        out: list[dict[str, Any]] = []
        for x in p:
            if isinstance(x, str):
                out.append({"prompt": x})
            elif isinstance(x, list) and x and all(isinstance(t, int) for t in x):
                out.append({"prompt_token_ids": list(x)})
            else:
                raise APIError.of(
                    ErrorCode.BAD_REQUEST,
                    "prompt must be a string, a list of strings, token ids or lists of token ids",
                    param="prompt",
                )
        return out

    @field_validator("prompt")
    @classmethod
    def _prompt_shape(cls, p: Any) -> Any:
        def ids(x: Any) -> bool:
            return (
                isinstance(x, list) and bool(x) and all(type(t) is int and 0 <= t <= MAX_TOKEN_ID for t in x)
            )

        if isinstance(p, str):
            return valid_text(p)
        if isinstance(p, list) and (
            ids(p) or all(isinstance(x, str) and valid_text(x) for x in p) or all(ids(x) for x in p)
        ):
            return p
        raise ValueError(
            "prompt must be a string, a list of strings, a list of token ids (each in "
            f"[0, {MAX_TOKEN_ID}]) or a list of such lists"
        )


class ChatRequest(_Common):
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None

    @field_validator("messages")
    @classmethod
    def _text_only(cls, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for m in messages:
            chat_message(m)  # raises ValueError with a readable message
        return messages

    def check_supported(self) -> None:
        super().check_supported()
        if self.top_logprobs is not None and not self.logprobs:
            raise APIError.of(
                ErrorCode.BAD_REQUEST, "top_logprobs needs logprobs: true", param="top_logprobs"
            )

    def logprobs_k(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def chat_messages(self) -> list[ChatMessage]:
        return [chat_message(m) for m in self.messages]

    def tools_asked(self) -> ToolChoice | None:
        return check_tools(self.tools, self.tool_choice, self.parallel_tool_calls)

    def _constraints(self) -> dict[str, StructuredOutput]:
        out = super()._constraints()
        asked = self.tools_asked()
        calls = asked.grammar() if asked is not None else None
        if calls is not None:
            out["tool_choice"] = calls
        return out

    def template_tools(self) -> list[Tool] | None:
        asked = self.tools_asked()
        return asked.tools if asked is not None else None

    def tool_output(self, base: str) -> ToolOutput | None:
        """What parses the tool calls of the response's choices (None: no tools)."""
        asked = self.tools_asked()
        return ToolOutput(asked, base) if asked is not None else None


def check_processors(params: SamplingParams) -> None:
    """400 for a logits processor or output the engine does not honour yet, by name."""
    asked = {
        "presence_penalty": params.presence_penalty != 0.0,
        "frequency_penalty": params.frequency_penalty != 0.0,
        "repetition_penalty": params.repetition_penalty != 1.0,
        "logit_bias": bool(params.logit_bias),
        "min_tokens": params.min_tokens > 0,
        "logprobs": params.logprobs is not None,
    }
    for name, on in asked.items():
        if on and name not in ENGINE_PROCESSORS:
            raise APIError.of(
                ErrorCode.BAD_REQUEST, f"{name} is not supported by this server yet", param=name
            )
