"""The control plane's messages: what a worker's engine step reports (``StepStats``, and as
``Telemetry`` with who sent it), the planner's versioned ``Decision``, a ``PolicyCommand`` that
swaps the planner's policy, and a worker's registration (``WorkerInfo``). The job messages
are in ``shared.schemas``; both kinds go through ``shared.codec``.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from shared.schemas import Message

MAX_NAME = 256  # a drafter's name
# The upper bound of a γ table's last bucket: "every batch size from here on".
ALL_BATCHES = 1 << 30


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


class Lookahead(BaseModel):
    """A model-free drafter judged on verified text (worker/engine/spec/lookahead.py): at each
    judged position, the proposal of ``depth`` = len − 1 tokens it would have made; counts of
    positions by how many of them led the verified tokens, and by how many it proposed."""

    model_config = ConfigDict(extra="forbid")
    accepted: list[Annotated[int, Field(ge=0)]] = Field(max_length=64)  # [a]: positions with a accepted
    proposed: list[Annotated[int, Field(ge=0)]] = Field(max_length=64)  # [l]: positions proposing l tokens


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
    counterfactual_time: float = 0.0  # scoring the other drafters (verified tokens, new prompts)
    # The worker service's own time between the last step's end and this step's start (its
    # writes, telemetry, intake; 0 after waiting for work): what a step costs as served beyond
    # ``step_time``. Set by the service, not the engine.
    gap_time: float = 0.0
    prompts_scored: int = 0  # new sequences whose prompt every drafter scored (the cost rule)
    proposed: int = 0  # draft tokens proposed this step
    accepted: int = 0  # draft tokens accepted this step
    num_drafts: int = 0  # sequences that drafted this step
    accepted_per_pos: list[int] = Field(default_factory=list)  # accepted drafts at each position
    counterfactual: dict[str, float] = Field(default_factory=dict)  # drafter -> acceptance rate
    lookahead: dict[str, Lookahead] = Field(default_factory=dict)  # model-free drafters, judged every step
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


Seconds = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
Probability = Annotated[float, Field(ge=0.0, le=1.0)]
DrafterName = Annotated[str, Field(max_length=MAX_NAME)]


def batch_class(batch: int) -> int:
    """A batch size's class, the power of two above it: 1 for one sequence, 2 for 2–3, 3 for
    4–7, … The planner prices steps per class; a worker's sequence holds its pair within one."""
    return max(int(batch), 1).bit_length()


class StepCosts(BaseModel):
    """The planner's prediction of one step at ``batch`` decoding sequences: ``plain_s`` for a
    plain step (γ = 0), ``spec_s[drafter][γ − 1]`` for a step that drafts γ tokens per sequence
    with that drafter and verifies them (drafting, the verify forward and what speculating adds,
    as served). What the cost rule (worker/engine/spec/plan.py) divides by E(α, γ)."""

    model_config = ConfigDict(extra="forbid")
    batch: int = Field(ge=1)
    plain_s: Seconds
    spec_s: dict[DrafterName, list[Seconds]] = Field(default_factory=dict, max_length=64)


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
    # Per drafter, one draft step's time relative to one plain target step (the startup
    # profile's, at the batch size the workers run): a per-request learner weighs each
    # drafter's acceptance against it (router.py). Empty: acceptance alone.
    drafter_costs: dict[str, Annotated[float, Field(ge=0.0, allow_inf_nan=False)]] = Field(
        default_factory=dict, max_length=64
    )
    # Drafters the planner found dominated (surely slower than the best, drafting cost
    # included): neither scored nor chosen per request until their acceptance is unsure again.
    skip_drafters: list[Annotated[str, Field(max_length=MAX_NAME)]] = Field(
        default_factory=list, max_length=64
    )
    offload: bool = False
    # The cost rule (worker/engine/spec/plan.py): with ``step_costs`` (ascending batch sizes,
    # interpolated between them), each decoding sequence drafts with the (drafter, γ) of least
    # predicted time per token at its own acceptance — its prompt's teacher-forced score and its
    # own verifications, from ``acceptance`` (per drafter, the prior mean) — and switches into
    # another drafter's pair only after K steps (``hold_by_drafter``, else ``hold_steps``) unless
    # its batch-size class changes. ``gamma_table`` and ``drafter``
    # then only describe the decision (γ and drafter at the prior acceptance). Empty: they decide.
    step_costs: list[StepCosts] = Field(default_factory=list, max_length=64)
    acceptance: dict[DrafterName, Probability] = Field(default_factory=dict, max_length=64)
    # Per drafter, the highest acceptance a sequence could plausibly have (the prior's upper
    # bound): where no drafter pays even there, the workers do no speculative work at all.
    acceptance_hi: dict[DrafterName, Probability] = Field(default_factory=dict, max_length=64)
    hold_steps: int = Field(default=1, ge=1, le=1 << 16)
    # K per drafter, from that drafter's own switching cost: a switch into its pairs waits K
    # steps of the held pair (a model-free drafter catches up on nothing: the least K, as a
    # switch to plain decoding); a drafter not named waits ``hold_steps``.
    hold_by_drafter: dict[DrafterName, Annotated[int, Field(ge=1, le=1 << 16)]] = Field(
        default_factory=dict, max_length=64
    )
    # The drafter's catch-up, in tokens, that ``hold_by_drafter``'s K is computed for: a
    # sequence the drafter is only L < ``hold_tokens`` tokens behind (its catch-up is that much
    # smaller) waits ⌈K · L / hold_tokens⌉ steps, at least 1. 0: K whatever the lag.
    hold_tokens: int = Field(default=0, ge=0, le=1 << 20)

    @field_validator("step_costs")
    @classmethod
    def _ascending(cls, costs: list[StepCosts]) -> list[StepCosts]:
        batches = [c.batch for c in costs]
        if batches != sorted(set(batches)):
            raise ValueError("step_costs need distinct batch sizes in ascending order")
        return costs

    # Workers each model needs under the planner's SLO (planner/capacity.py): for operators
    # and autoscalers (also the gauge nightjar:planner_desired_workers); workers ignore it.
    desired_workers: dict[
        Annotated[str, Field(max_length=MAX_NAME)], Annotated[int, Field(ge=0, le=1_000_000)]
    ] = Field(default_factory=dict, max_length=1024)
    created_at: float = Field(default_factory=time.time)
    valid_for_s: float = 30.0
    note: str = ""
    # The control-stream entry id of the PolicyCommand whose policy made this decision ("" for
    # the planner's own default). Every decision of that policy keeps it — periodic republishes
    # too, whose note no longer says who asked — so a caller knows when its swap is in force.
    command_id: str = Field(default="", max_length=64)

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
    id: str = Field(default="", max_length=64)  # its control-stream entry id, once the planner read it


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
    drafters: list[str] = Field(default_factory=list)  # the drafters it offers (names)

    def is_alive(self, now: float | None = None, timeout_s: float = 15.0) -> bool:
        return (now if now is not None else time.time()) - self.ts <= timeout_s
