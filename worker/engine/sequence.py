"""One request's state inside the engine.

``token_ids`` is prompt + output. ``num_computed`` counts the leading tokens whose keys and
values are in the paged cache; the rest are fed to the next forward. A decoding sequence
normally has exactly one uncomputed token (the last one sampled). Speculation appends draft
tokens after it and, after verification, ``truncate`` drops the rejected ones.

A failover resume hands the engine prompt + the output already sent as its prompt; ``resumed``
says how many of the prompt's last tokens are that output, so ``position`` — the index of a
token in the job's whole output, which keys a seeded draw (keyed.py) — continues the count.
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field

import torch

from shared.errors import ErrorCode
from shared.schemas import FinishReason, SamplingParams
from worker.engine.api import DraftOutcome
from worker.engine.grammar import Constraint
from worker.engine.logprobs import LogprobState
from worker.engine.sampler import is_keyed, new_generator
from worker.engine.spec.plan import SeqSpec
from worker.engine.spec.router import DrafterChoice

_order = itertools.count()


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    priority: int = 0
    arrival_time: float = 0.0
    status: Status = Status.WAITING
    token_ids: list[int] = field(default_factory=list)
    num_computed: int = 0
    num_cached_prompt: int = 0  # prompt tokens the prefix cache served at first admission
    admitted: bool = False  # has been scheduled at least once
    prefilling: bool = False  # (re)admitted and not sampled since: its prompt is being computed
    suspect: bool = False  # was in a batch the engine failed on: runs alone until cleared
    generator: torch.Generator | None = None
    finish_reason: FinishReason | None = None
    error: str | None = None
    error_code: ErrorCode | None = None
    num_reported: int = 0  # output tokens already handed to the caller
    grammar: Constraint | None = None  # structured output: the grammar's state (grammar.py)
    logprobs: LogprobState | None = None  # set when the request asks for logprobs (logprobs.py)
    drafter_choice: DrafterChoice | None = None  # per-request drafter choice (spec/router.py)
    outcomes: list[DraftOutcome] = field(default_factory=list)  # steps since the last report
    spec: SeqSpec = field(default_factory=SeqSpec)  # acceptance and pair under the cost rule (spec/plan.py)
    resumed: int = 0  # the prompt's last tokens that are output an earlier attempt sent
    order: int = field(default_factory=lambda: next(_order))

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_token_ids)
        if not self.params.greedy and not self.keyed:
            self.generator = new_generator(self.params)  # unseeded: rejection sampling draws from it
        if self.params.logprobs is not None or self.params.prompt_logprobs is not None:
            self.logprobs = LogprobState(self.params.logprobs, self.params.prompt_logprobs)

    @property
    def num_prompt(self) -> int:
        return len(self.prompt_token_ids)

    def position(self, index: int) -> int:
        """The output position of the token at ``index`` of ``token_ids`` (a resume's sent
        output counted: position 0 is the job's first output token)."""
        return index - self.num_prompt + self.resumed

    @property
    def num_output(self) -> int:
        return len(self.token_ids) - len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt :]

    @property
    def num_uncomputed(self) -> int:
        return len(self.token_ids) - self.num_computed

    @property
    def keyed(self) -> bool:
        """A seeded sampled request: each token is drawn keyed on (seed, its position)."""
        return is_keyed(self.params)

    @property
    def wants_prompt_logprobs(self) -> bool:
        """Its prompt's logprobs are asked for and not complete: every prompt row is
        computed, none served from the prefix cache."""
        return self.logprobs is not None and self.logprobs.prompt_pending(self.num_prompt)

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED

    def sort_key(self) -> tuple[int, float, int]:
        """Scheduling order: lower priority value first, then arrival (FCFS)."""
        return (self.priority, self.arrival_time, self.order)

    def append(self, token_id: int) -> None:
        self.token_ids.append(token_id)

    def truncate(self, num_tokens: int) -> None:
        """Keep the first ``num_tokens`` tokens (never fewer than the prompt)."""
        if num_tokens < self.num_prompt:
            raise ValueError("cannot truncate into the prompt")
        del self.token_ids[num_tokens:]
        self.num_computed = min(self.num_computed, num_tokens)

    def reset_for_recompute(self) -> None:
        """Preempted: its cache is gone, so everything is computed again on readmission."""
        self.status = Status.WAITING
        self.num_computed = 0
        self.finish_reason = None

    def finish(self, reason: FinishReason) -> None:
        """Finished, for ``reason``."""
        self.status = Status.FINISHED
        self.finish_reason = reason

    def fail(self, code: ErrorCode, message: str) -> None:
        """Finish with reason "error": ``code`` says whose fault (shared/errors.py)."""
        self.finish(FinishReason.ERROR)
        self.error_code, self.error = ErrorCode(code), message
