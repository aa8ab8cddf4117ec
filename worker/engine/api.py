"""The engine's contract with the worker service.

The worker service (asyncio, Redis) owns requests' lifecycles; the engine (synchronous,
torch) owns the model, the KV cache and the schedule. The service calls ``add_request``,
``abort_request`` and ``apply_decision`` from the event loop (thread-safe: they queue work
for the next step) and runs ``step()`` in one worker thread. Each step is
schedule → run → postprocess and returns the new tokens of every request that moved.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from shared.schemas import Decision, SamplingParams, SwitchCostEvent


@dataclass
class EngineRequest:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    priority: int = 0  # lower runs first; FCFS within a priority
    arrival_time: float = field(default_factory=time.monotonic)


@dataclass
class RequestOutput:
    request_id: str
    new_token_ids: list[int]
    finished: bool = False
    finish_reason: str | None = None  # "stop" (an EOS token), "length", "cancelled", "error"
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0  # total so far, including new_token_ids
    cached_prompt_tokens: int = 0  # prompt tokens served from the prefix cache
    error: str | None = None


@dataclass
class StepStats:
    """What one step did; the worker turns it into a Telemetry message."""

    step: int = 0
    batch_size: int = 0  # sequences decoding this step
    prefill_tokens: int = 0
    num_tokens: int = 0  # output tokens emitted this step
    gamma: int = 0
    drafter: str | None = None
    step_time: float = 0.0
    draft_time: float = 0.0
    verify_time: float = 0.0
    other_time: float = 0.0  # includes catch-up (switch_costs) and counterfactual_time
    counterfactual_time: float = 0.0
    proposed: int = 0
    accepted: int = 0
    counterfactual: dict[str, float] = field(default_factory=dict)
    mean_context: float = 0.0
    running: int = 0
    waiting: int = 0
    free_blocks: int = 0
    total_blocks: int = 0
    draft_resident: bool = True
    switch_costs: list[SwitchCostEvent] = field(default_factory=list)
    prefix_queries: int = 0
    prefix_hits: int = 0
    preempted: int = 0
    decision_version: int = 0
    fallback: bool = False
    memory_events: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class StepResult:
    outputs: list[RequestOutput]
    stats: StepStats


class Engine(ABC):
    """A continuously batching generator of tokens."""

    eos_token_ids: frozenset[int] = frozenset()

    @abstractmethod
    def add_request(self, request: EngineRequest) -> None:
        """Queue a request; it joins the batch at a coming step. Thread-safe."""

    @abstractmethod
    def abort_request(self, request_id: str) -> None:
        """Stop a request and free its memory; the next step reports it finished with reason
        "cancelled" (unknown or finished ids are ignored). Thread-safe."""

    @abstractmethod
    def apply_decision(self, decision: Decision) -> None:
        """Use this planner decision from the next step on. Thread-safe."""

    @abstractmethod
    def step(self) -> StepResult:
        """Run one iteration. Called from one thread only."""

    @abstractmethod
    def has_unfinished(self) -> bool:
        """True while any request is queued, running, or has an unreported result."""
