"""The engine's contract with the worker service.

The worker service (asyncio, Redis) owns requests' lifecycles; the engine (synchronous,
torch) owns the model, the KV cache and the schedule. The service calls ``add_request``,
``abort_request`` and ``apply_plan`` (the planner's decision as a ``SpeculationPlan``, built
by the worker: worker/speculation.py) from the event loop (thread-safe: they queue work
for the next step) and runs ``step()`` in one worker thread. Each step is
schedule → draft → forward → verify → commit and returns the new tokens of every request
that moved. A request the engine fails on is finished alone (finish_reason "error" with an
``error_code``); the rest of its batch goes on.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from shared.control import StepStats
from shared.errors import ErrorCode
from shared.schemas import FinishReason, Logprobs, SamplingParams
from worker.engine.spec.speculation_plan import SpeculationPlan

__all__ = ["DraftOutcome", "Engine", "EngineRequest", "RequestOutput", "StepResult", "StepStats"]


@dataclass
class EngineRequest:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    priority: int = 0  # lower runs first; FCFS within a priority
    arrival_time: float = field(default_factory=time.monotonic)
    # The prompt's last tokens that are output an earlier attempt sent: a grammar consumes them, the
    # processors count them as output, and a seeded draw's position continues after them.
    resumed: int = 0


@dataclass(frozen=True, slots=True)
class DraftOutcome:
    """What speculation did for one request in one engine step: the tokens the step emitted
    for it are ``accepted`` drafts (the drafter's tokens the target kept), then at most one
    token of the target's own (after a rejection, after all drafts passed, or at γ = 0)."""

    tokens: int  # emitted this step (after an EOS, max_tokens or grammar cut)
    accepted: int = 0  # of them, accepted drafts: always the first ``accepted``
    drafted: int = 0  # drafts proposed (0: none, e.g. γ = 0, a prompt's first token)
    gamma: int = 0  # drafts asked for (the plan's γ, capped by what may still be emitted)
    drafter: str | None = None  # the drafter that proposed them (None: no drafts)


@dataclass
class RequestOutput:
    request_id: str
    new_token_ids: list[int]
    finished: bool = False
    finish_reason: FinishReason | None = None  # "stop" (an EOS token), "length", "cancelled", "error"
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0  # total so far, including new_token_ids
    cached_prompt_tokens: int = 0  # prompt tokens served from the prefix cache
    error: str | None = None  # finish_reason "error": what went wrong, for the client
    error_code: ErrorCode | None = None  # finish_reason "error": CONTEXT_LENGTH_EXCEEDED, ENGINE_ERROR, ...
    # Asked for (params.logprobs / prompt_logprobs): ids and values, no text (the worker renders it).
    logprobs: Logprobs | None = None  # of new_token_ids, one entry each
    prompt_logprobs: Logprobs | None = None  # of the prompt, once: with the first output token
    # One per engine step whose tokens are in new_token_ids, in order; their ``tokens`` add up
    # to len(new_token_ids). Which tokens were accepted drafts (the chat page's marking).
    outcomes: list[DraftOutcome] = field(default_factory=list)


@dataclass
class StepResult:
    outputs: list[RequestOutput]
    stats: StepStats


class Engine(ABC):
    """A continuously batching generator of tokens."""

    eos_token_ids: frozenset[int] = frozenset()
    weights: str = ""  # the target's weights as served: "Q4_1" (GGUF blocks), "float32", ... ("": not known)

    @abstractmethod
    def add_request(self, request: EngineRequest) -> None:
        """Queue a request; it joins the batch at a coming step. Thread-safe."""

    @abstractmethod
    def abort_request(self, request_id: str) -> None:
        """Stop a request and free its memory; the next step reports it finished with reason
        "cancelled" (unknown or finished ids are ignored). Thread-safe."""

    @abstractmethod
    def apply_plan(self, plan: SpeculationPlan) -> None:
        """Speculate by ``plan`` from the next step on. Thread-safe."""

    @abstractmethod
    def step(self) -> StepResult:
        """Run one iteration. Called from one thread only."""

    @property
    def max_model_len(self) -> int:
        """The most tokens (prompt + output) one sequence may hold in this engine: the
        model's context, capped by the configuration and by what the KV cache can hold
        (0: not known)."""
        return 0

    @abstractmethod
    def has_unfinished(self) -> bool:
        """True while any request is queued, running, or has an unreported result."""
