"""Typed messages that cross a service boundary: the base class and the job messages
(a request, its events, a cancel). The control plane's messages — telemetry, decisions,
policy commands, worker registrations — are in ``shared.control``.

Every message is a pydantic model with a class-level ``kind`` tag; ``shared.codec`` turns
them into msgpack bytes (with a schema version) and back. Services never exchange dicts.
"""

from __future__ import annotations

import time
from enum import StrEnum
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from shared.errors import ErrorCode
from shared.structured import MAX_TOOLS, StructuredOutput, Tool, ToolCall


class FinishReason(StrEnum):
    """Why a job (or an engine request) ended; on the wire, and to clients, its value. The
    OpenAI routes may say ``"tool_calls"`` instead of ``STOP`` (gateway/tools.py)."""

    STOP = "stop"  # an EOS token, a stop token or a stop string
    LENGTH = "length"  # max_tokens, or the largest context the cache holds
    CANCELLED = "cancelled"
    ERROR = "error"  # the engine failed on this request alone (ErrorEvent for the client)


class Message(BaseModel):
    """Base of every wire message; ``kind`` names the type in the codec envelope."""

    model_config = ConfigDict(extra="forbid")
    kind: ClassVar[str] = ""


# --------------------------------------------------------------------------- jobs


# Bounds that keep every value packable (msgpack: 64-bit ints, UTF-8 strings) and sane.
INT32_MAX = 2**31 - 1
# repetition_penalty divides positive logits: a floor keeps them finite (a logit of at most
# ~1e4 over 1e-2 is far from float32's 3.4e38; an unbounded 1e-300 made them inf, then NaN).
MIN_REPETITION_PENALTY = 1e-2
MAX_REPETITION_PENALTY = 10.0
TEMPERATURE_FLOOR = 1e-4  # 0 < temperature < this is raised to it: float32 must not round it to 0
MAX_TOKEN_ID = INT32_MAX
JOB_ID_PATTERN = r"^[A-Za-z0-9_-]{1,128}$"  # never ':' or braces: ids become parts of Redis keys
MAX_MODEL_NAME = 256


def valid_text(v: str) -> str:
    """``v`` unchanged if it is valid Unicode (encodable as UTF-8: no lone surrogates)."""
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("text must be valid Unicode (no lone surrogates)") from None
    return v


MAX_LOGPROBS = 20  # top logprobs per position (OpenAI allows 5 on completions, 20 on chat; vLLM 20)
TokenId = Annotated[int, Field(ge=0, le=MAX_TOKEN_ID)]
Bias = Annotated[float, Field(ge=-100.0, le=100.0, allow_inf_nan=False)]


class SamplingParams(BaseModel):
    """How to pick tokens. temperature == 0 means greedy; 0 < temperature < TEMPERATURE_FLOOR
    is raised to the floor (it samples, almost greedily, from the same seed)."""

    model_config = ConfigDict(extra="forbid")

    max_tokens: int = Field(default=64, ge=1, le=32768)
    temperature: float = Field(default=0.0, ge=0.0, le=10.0, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: int = Field(default=0, ge=0, le=INT32_MAX)  # 0 = no top-k filter
    seed: int | None = Field(default=None, ge=0, lt=2**63)
    stop: list[str] = Field(default_factory=list, max_length=16)
    ignore_eos: bool = False
    # OpenAI's and vLLM's processors over the target's logits (the engine applies them before
    # verification, so speculative output equals the target's own under the same processors).
    min_tokens: int = Field(default=0, ge=0, le=32768)  # EOS and stop_token_ids masked before this
    stop_token_ids: list[TokenId] = Field(default_factory=list, max_length=256)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0, allow_inf_nan=False)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0, allow_inf_nan=False)
    repetition_penalty: float = Field(
        default=1.0, ge=MIN_REPETITION_PENALTY, le=MAX_REPETITION_PENALTY, allow_inf_nan=False
    )
    logit_bias: dict[TokenId, Bias] = Field(default_factory=dict, max_length=1024)
    # The target's raw log-softmax (before any processor or temperature): None = none, k = each
    # output token's and the top k at its position; prompt_logprobs: the same for the prompt.
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    prompt_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    structured: StructuredOutput | None = None  # a grammar the output must match (a token mask)

    @field_validator("temperature")
    @classmethod
    def _temperature_floor(cls, v: float) -> float:
        return TEMPERATURE_FLOOR if 0.0 < v < TEMPERATURE_FLOOR else v

    @field_validator("stop")
    @classmethod
    def _no_empty_stop(cls, v: list[str]) -> list[str]:
        if any(s == "" for s in v):
            raise ValueError("stop sequences must be non-empty strings")
        if any(len(s) > 1024 for s in v):
            raise ValueError("stop sequences must be at most 1024 characters")
        for s in v:
            valid_text(s)
        return v

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def processed(self) -> bool:
        """Any logits processor beyond temperature / top-k / top-p (a grammar too) is asked for."""
        return bool(
            self.min_tokens
            or self.presence_penalty
            or self.frequency_penalty
            or self.repetition_penalty != 1.0
            or self.logit_bias
            or self.structured is not None
        )


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    tool_calls: list[ToolCall] | None = Field(default=None, max_length=MAX_TOOLS)  # an assistant's calls
    tool_call_id: str | None = Field(default=None, max_length=256)  # a tool message: the call it answers
    name: str | None = Field(default=None, max_length=256)

    @field_validator("content")
    @classmethod
    def _valid_content(cls, v: str) -> str:
        return valid_text(v)


class JobRequest(Message):
    """A generation job, as the gateway enqueues it on the job stream."""

    kind: ClassVar[str] = "job"

    job_id: str = Field(min_length=1, max_length=128, pattern=JOB_ID_PATTERN)
    model: str = Field(default="", max_length=MAX_MODEL_NAME)  # the served model name ("" before routing)
    prompt: str | None = None
    prompt_token_ids: list[Annotated[int, Field(ge=0, le=MAX_TOKEN_ID)]] | None = None
    messages: list[ChatMessage] | None = None  # chat: the worker applies the model's template
    tools: list[Tool] | None = Field(default=None, max_length=MAX_TOOLS)  # for the chat template
    params: SamplingParams = Field(default_factory=SamplingParams)
    priority: int = Field(default=0, ge=-INT32_MAX, le=INT32_MAX)  # lower runs first; FCFS within one
    created_at: float = Field(default_factory=time.time, allow_inf_nan=False)
    request_id: str | None = Field(default=None, max_length=128, pattern=r"^[!-~]+$")  # its X-Request-Id
    metadata: dict[str, str] = Field(default_factory=dict, max_length=16)  # the client's, returned as given
    # How the job's tokens are read (vLLM's RequestOutputKind): "delta", a client may follow
    # them as they come, so every step's tokens are written; "final_only", its client waits
    # for the result alone (OpenAI's non-streaming routes, batches), so the worker writes the
    # tokens at most every ``progress_s`` and the rest with the result.
    output_kind: Literal["delta", "final_only"] = "delta"
    # The client asked for its tokens' speculation facts (``TokenEvent.spec``: which were
    # accepted drafts, each step's drafter and γ): the chat page, ``nightjar chat``.
    include_spec: bool = False

    @field_validator("metadata")
    @classmethod
    def _valid_metadata(cls, v: dict[str, str]) -> dict[str, str]:
        for k, x in v.items():
            if len(k) > 64 or len(x) > 512:
                raise ValueError("metadata keys are at most 64 characters, values at most 512")
            valid_text(k)
            valid_text(x)
        return v

    @field_validator("prompt")
    @classmethod
    def _valid_prompt(cls, v: str | None) -> str | None:
        return None if v is None else valid_text(v)

    @model_validator(mode="after")
    def _exactly_one_input(self) -> JobRequest:
        given = [x is not None for x in (self.prompt, self.prompt_token_ids, self.messages)]
        if sum(given) != 1:
            raise ValueError("give exactly one of prompt, prompt_token_ids, messages")
        if self.prompt_token_ids is not None and not self.prompt_token_ids:
            raise ValueError("prompt_token_ids must not be empty")
        if self.messages is not None and not self.messages:
            raise ValueError("messages must not be empty")
        return self


# ------------------------------------------------------------------ job events


class JobEvent(Message):
    """Base of the events written to a job's own event stream."""

    job_id: str


class StartEvent(JobEvent):
    """A worker took the job (attempt counts deliveries, from 1)."""

    kind: ClassVar[str] = "start"
    worker_id: str
    attempt: int = 1
    prompt_tokens: int = 0


class Logprobs(BaseModel):
    """Log-probabilities of consecutive tokens, column by column (compact on the wire): token
    i is ``token_ids[i]``, rendered alone as ``tokens[i]``, with the target's log-probability
    ``logprobs[i]`` (None only for a prompt's first token, which nothing predicts, or an output
    token an earlier attempt sent without them) and the
    ``top_ids[i]`` / ``top_tokens[i]`` / ``top_logprobs[i]`` of its position, most likely
    first (empty lists for k = 0 and for a prompt's first token)."""

    model_config = ConfigDict(extra="forbid")
    token_ids: list[int] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    logprobs: list[float | None] = Field(default_factory=list)
    top_ids: list[list[int]] = Field(default_factory=list)
    top_tokens: list[list[str]] = Field(default_factory=list)
    top_logprobs: list[list[float]] = Field(default_factory=list)

    def __len__(self) -> int:
        return len(self.token_ids)

    def slice(self, start: int, stop: int | None = None) -> Logprobs:
        """Tokens ``start .. stop`` (a new object; not validated again)."""
        s = slice(start, stop)
        return Logprobs.model_construct(
            token_ids=self.token_ids[s],
            tokens=self.tokens[s],
            logprobs=self.logprobs[s],
            top_ids=self.top_ids[s],
            top_tokens=self.top_tokens[s],
            top_logprobs=self.top_logprobs[s],
        )

    @classmethod
    def join(cls, parts: list[Logprobs]) -> Logprobs:
        """The parts' tokens, in order, as one object (not validated again)."""
        out = cls.model_construct(
            token_ids=[], tokens=[], logprobs=[], top_ids=[], top_tokens=[], top_logprobs=[]
        )
        for p in parts:
            out.token_ids += p.token_ids
            out.tokens += p.tokens
            out.logprobs += p.logprobs
            out.top_ids += p.top_ids
            out.top_tokens += p.top_tokens
            out.top_logprobs += p.top_logprobs
        return out


MAX_SPEC_GAMMA = 1024  # bounds of the speculation facts (the engine's γ is far below)


class SpecStep(BaseModel):
    """What speculation did for a job in one engine step: its ``tokens`` are ``accepted``
    drafts (of ``drafted`` proposed by ``drafter``, ``gamma`` asked for), then the target's
    own token (after a rejection, after every draft passed, or with nothing drafted) unless
    the step's output was cut there (EOS, max_tokens, a stop)."""

    model_config = ConfigDict(extra="forbid")
    tokens: int = Field(ge=0, le=MAX_SPEC_GAMMA + 1)
    accepted: int = Field(default=0, ge=0, le=MAX_SPEC_GAMMA)
    drafted: int = Field(default=0, ge=0, le=MAX_SPEC_GAMMA)
    gamma: int = Field(default=0, ge=0, le=MAX_SPEC_GAMMA)
    drafter: str | None = Field(default=None, max_length=MAX_MODEL_NAME)

    @model_validator(mode="after")
    def _consistent(self) -> SpecStep:
        if not (self.accepted <= min(self.drafted, self.tokens) and self.tokens <= self.accepted + 1):
            raise ValueError("a step emits its accepted drafts and at most one token more")
        return self


class SpecSpan(BaseModel):
    """A run of an event's text produced by one output token: ``token`` is its position in
    the output, ``drafted`` whether it was an accepted draft (None: not known, a token an
    earlier attempt of the job produced)."""

    model_config = ConfigDict(extra="forbid")
    text: str
    token: int = Field(ge=0)
    drafted: bool | None = None


class Speculation(BaseModel):
    """A token event's speculation facts (asked for: ``JobRequest.include_spec``). ``steps``
    are the engine steps whose tokens are the event's ``token_ids`` (their ``tokens`` add up
    to its length), ``spans`` the event's ``text`` cut where the token that produced it
    changes (joined, they are the text: a character held back, for a stop string or an
    unfinished UTF-8 sequence, belongs to the token that completed it)."""

    model_config = ConfigDict(extra="forbid")
    steps: list[SpecStep] = Field(default_factory=list)
    spans: list[SpecSpan] = Field(default_factory=list)

    @property
    def drafted(self) -> list[bool]:
        """One flag per token of the event: an accepted draft, or the target's own token."""
        return [j < s.accepted for s in self.steps for j in range(s.tokens)]


class TokenEvent(JobEvent):
    """New output tokens; ``index`` is the position of the first one in the output.
    ``logprobs`` (asked for: ``SamplingParams.logprobs``) covers exactly ``token_ids``;
    ``prompt_logprobs`` (``SamplingParams.prompt_logprobs``) comes once, on the job's first
    token event. ``spec`` (asked for: ``JobRequest.include_spec``) says which of the tokens
    were accepted drafts, and which token produced each part of the text."""

    kind: ClassVar[str] = "token"
    index: int
    token_ids: list[int]
    text: str
    logprobs: Logprobs | None = None
    prompt_logprobs: Logprobs | None = None
    spec: Speculation | None = None

    @model_validator(mode="after")
    def _spec_covers_the_event(self) -> TokenEvent:
        if self.spec is not None:
            if sum(s.tokens for s in self.spec.steps) != len(self.token_ids):
                raise ValueError("spec steps must account for exactly the event's tokens")
            if "".join(p.text for p in self.spec.spans) != self.text:
                raise ValueError("spec spans must be the event's text")
        return self


class FinishEvent(JobEvent):
    """The job ended normally (or was cancelled); carries the whole result."""

    kind: ClassVar[str] = "finish"
    finish_reason: FinishReason
    text: str
    token_ids: list[int]
    prompt_tokens: int
    completion_tokens: int
    worker_id: str = ""
    ttft_s: float | None = None
    latency_s: float | None = None
    logprobs: Logprobs | None = None  # of every token of token_ids, when asked for
    prompt_logprobs: Logprobs | None = None  # of the prompt's tokens, when asked for


class ErrorEvent(JobEvent):
    """The job failed; the client always hears about it."""

    kind: ClassVar[str] = "error"
    code: ErrorCode  # on the wire its value: "bad_request", "dead_letter", "internal", ...
    message: str

    @field_validator("code", mode="before")
    @classmethod
    def _known_code(cls, v: object) -> object:
        """A code this version does not know (a newer worker's, mid rolling upgrade) is an
        internal error, not a message the reader fails on: the job is still answered once."""
        if isinstance(v, str) and v not in ErrorCode._value2member_map_:
            return ErrorCode.INTERNAL
        return v


class CancelRequest(Message):
    """Broadcast on the cancel stream so whichever worker runs the job stops it."""

    kind: ClassVar[str] = "cancel"
    job_id: str
