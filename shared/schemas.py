"""Typed messages that cross a service boundary.

Every message is a pydantic model with a class-level ``kind`` tag; ``shared.codec`` turns
them into msgpack bytes (with a schema version) and back. Services never exchange dicts.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from shared.structured import MAX_TOOLS, StructuredOutput, Tool, ToolCall

FinishReason = Literal["stop", "length", "cancelled", "error"]

# The upper bound of a γ table's last bucket: "every batch size from here on".
ALL_BATCHES = 1 << 30


class Message(BaseModel):
    """Base of every wire message; ``kind`` names the type in the codec envelope."""

    model_config = ConfigDict(extra="forbid")
    kind: ClassVar[str] = ""


# --------------------------------------------------------------------------- jobs


# Bounds that keep every value packable (msgpack: 64-bit ints, UTF-8 strings) and sane.
INT32_MAX = 2**31 - 1
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
    temperature: float = Field(default=0.0, ge=0.0, le=10.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
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
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=10.0, allow_inf_nan=False)
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


class TokenEvent(JobEvent):
    """New output tokens; ``index`` is the position of the first one in the output.
    ``logprobs`` (asked for: ``SamplingParams.logprobs``) covers exactly ``token_ids``;
    ``prompt_logprobs`` (``SamplingParams.prompt_logprobs``) comes once, on the job's first
    token event."""

    kind: ClassVar[str] = "token"
    index: int
    token_ids: list[int]
    text: str
    logprobs: Logprobs | None = None
    prompt_logprobs: Logprobs | None = None


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
    code: str  # e.g. "bad_request", "dead_letter", "internal"
    message: str


class CancelRequest(Message):
    """Broadcast on the cancel stream so whichever worker runs the job stops it."""

    kind: ClassVar[str] = "cancel"
    job_id: str


# ------------------------------------------------------------ telemetry / planner


class SwitchCostEvent(BaseModel):
    """A drafter caught up on tokens it missed while speculation was off."""

    model_config = ConfigDict(extra="forbid")
    drafter: str
    batch_size: int
    tokens: int  # largest number of tokens one sequence had to catch up
    seconds: float
    input_len: int = 0  # longest context (prompt + output tokens) among those sequences


class MemoryEvent(BaseModel):
    """One completed change of the target's KV pool: an elastic-memory move of the drafters'
    weights (``offload`` / ``reload``) or a plain pool resize (``kv_resize``)."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["offload", "reload", "kv_resize"]
    seconds: float  # the weight move, start to completion (kv_resize: the pool resize)
    kv_seconds: float = 0.0  # the pool resize of an offload / reload
    bytes: int = 0  # bytes handed from the drafters to the target's pool, or back
    from_blocks: int = 0
    to_blocks: int = 0
    moved_blocks: int = 0  # live blocks moved out of a released tail
    preempted: int = 0  # sequences preempted because their blocks could not stay


class StepStats(BaseModel):
    """What one engine step did. ``Telemetry`` is a StepStats plus who sent it and when, so
    every field here reaches the planner under its own name (one list of fields, not two)."""

    model_config = ConfigDict(extra="forbid")
    step: int = 0
    batch_size: int = 0  # sequences decoding this step
    prefill_tokens: int = 0
    num_tokens: int = 0  # tokens emitted this step, all sequences
    gamma: int = 0  # the γ run (0 when nothing was drafted)
    drafter: str | None = None  # the drafter of the most sequences (request scope: drafter_shares)
    drafter_shares: dict[str, int] = Field(default_factory=dict)  # drafter -> sequences it drafted for
    step_time: float = 0.0
    draft_time: float = 0.0
    verify_time: float = 0.0
    other_time: float = 0.0  # includes catch-up (switch_costs) and counterfactual_time
    counterfactual_time: float = 0.0  # scoring the other drafters on the verified tokens
    proposed: int = 0  # draft tokens proposed this step
    accepted: int = 0  # draft tokens accepted this step
    num_drafts: int = 0  # sequences that drafted this step
    accepted_per_pos: list[int] = Field(default_factory=list)  # accepted drafts at each position
    counterfactual: dict[str, float] = Field(default_factory=dict)  # drafter -> acceptance rate
    mean_context: float = 0.0  # mean tokens per running sequence
    running: int = 0
    waiting: int = 0  # queued in the engine
    free_blocks: int = 0
    total_blocks: int = 0
    draft_resident: bool = True
    switch_costs: list[SwitchCostEvent] = Field(default_factory=list)
    prefix_queries: int = 0
    prefix_hits: int = 0
    preempted: int = 0  # sequences preempted (recompute) this step
    failed: int = 0  # requests the engine failed alone this step (finish_reason "error")
    decision_version: int = 0
    fallback: bool = False  # the planner's decision was stale; a built-in rule was used
    memory_events: list[MemoryEvent] = Field(default_factory=list)


class Telemetry(StepStats, Message):
    """One engine step (or an idle heartbeat, batch_size == 0) from one worker."""

    kind: ClassVar[str] = "telemetry"

    worker_id: str
    ts: float = Field(default_factory=time.time)
    queue_depth: int = 0  # waiting in the engine + pending on the job stream


class Decision(Message):
    """A versioned planner decision that every worker applies at each step."""

    kind: ClassVar[str] = "decision"

    version: int
    policy: str
    # (largest batch size of the bucket, γ); the last bucket covers every larger batch.
    gamma_table: list[tuple[int, int]] = Field(default_factory=lambda: [(ALL_BATCHES, 0)])
    drafter: str | None = None
    # "batch": every sequence drafts with ``drafter``; "request": each sequence follows its own
    # learner over the drafters (``request_learner``, forgetting ``request_discount``), starting
    # at ``drafter`` (worker/engine/spec/router.py).
    drafter_scope: Literal["batch", "request"] = "batch"
    request_learner: Literal["normalhedge", "hedge"] = "normalhedge"
    request_discount: float = Field(default=1.0, gt=0.0, le=1.0)
    # Score every drafter's counterfactual acceptance on the verified tokens (what a learner
    # over the drafters needs; a forward of each model drafter per speculative step). False:
    # only the drafter that drafted reports its realised acceptance.
    score_drafters: bool = True
    offload: bool = False
    created_at: float = Field(default_factory=time.time)
    valid_for_s: float = 30.0
    note: str = ""

    def gamma_for(self, batch_size: int) -> int:
        for upper, gamma in self.gamma_table:
            if batch_size <= upper:
                return gamma
        return self.gamma_table[-1][1] if self.gamma_table else 0

    def is_stale(self, now: float | None = None) -> bool:
        return (now if now is not None else time.time()) > self.created_at + self.valid_for_s


class PolicyCommand(Message):
    """Swap the planner's running policy (from the CLI or the gateway's admin route)."""

    kind: ClassVar[str] = "policy_command"
    policy: str
    params: dict[str, Any] = Field(default_factory=dict)
    requested_by: str = "cli"
    ts: float = Field(default_factory=time.time)


class WorkerInfo(Message):
    """A worker's registration in ``keys.WORKERS``, rewritten at every heartbeat."""

    kind: ClassVar[str] = "worker_info"
    worker_id: str
    model: str
    host: str = ""
    pid: int = 0
    started_at: float = Field(default_factory=time.time)
    ts: float = Field(default_factory=time.time)
    running: int = 0
    max_jobs: int = 0
    decision_version: int = 0
    fallback: bool = False
    max_model_len: int = 0  # the model's context in tokens (0: not known)
    draining: bool = False  # finishing its jobs before it stops: takes no new ones

    def is_alive(self, now: float | None = None, timeout_s: float = 15.0) -> bool:
        return (now if now is not None else time.time()) - self.ts <= timeout_s


ALL_MESSAGES: tuple[type[Message], ...] = (
    JobRequest,
    StartEvent,
    TokenEvent,
    FinishEvent,
    ErrorEvent,
    CancelRequest,
    Telemetry,
    Decision,
    PolicyCommand,
    WorkerInfo,
)
