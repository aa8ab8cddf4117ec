"""LLMEngine: continuous batching over a paged KV cache with exact prefix reuse, and
speculative decoding with a per-step γ, a drafter pool and elastic draft memory.

A step reads top to bottom: take the inbox (inbox.py) → elastic memory (a plan it applies)
→ choose (γ, drafter) → schedule (scheduler.py; every preemption is its) → draft (returns the
drafts) → forward (forward.py) → verify (a ``Verified`` per sequence: spec/verify.py) →
commit (commit.py: the one place a sequence's tokens, computed count and finish, the
target's blocks and the drafters' rollback change) → feedback → outputs, and one
``StepStats`` built from the phases' records (step_stats.py). Each phase returns named
records (records.py); none fills in an argument.

Speculation (worker/engine/spec/): γ comes from the latest ``SpeculationPlan`` (the worker
builds it from the planner's decision) at the batch size of decoding sequences; the scheduler
reserves γ slots after each decoding sequence, the active drafter proposes its drafts, and
one target forward computes γ+1 rows per decoding sequence (its last token, then its drafts)
next to the prefill chunks of others. Verification (greedy, keyed draws for seeded sampling,
rejection sampling for unseeded: spec/verify.py) emits 1..γ+1 tokens per sequence; commit
appends the accepted drafts and the target's token and rolls the rejected ones back in the
target (``BlockManager.truncate``) and in every drafter. γ = 0 runs no draft work at all.

Failure isolation: when draft, forward, verify or commit raises, every scheduled sequence
goes back to where it was before the step (drafts and anything appended dropped, blocks
freed, recomputed later: exact, as a preemption is). Alone, the sequence is the cause and
finishes with reason "error" (``ErrorCode.ENGINE_ERROR``); in a batch, each becomes a
*suspect* and runs alone (scheduler.py) until one decoding step of its own succeeds (cleared)
or fails (it finishes with the error). Its batch mates go on.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from shared.control import MemoryEvent
from shared.errors import ErrorCode
from shared.schemas import FinishReason
from worker.engine.api import Engine, EngineRequest, RequestOutput, StepResult
from worker.engine.block_manager import BlockManager
from worker.engine.commit import Commit
from worker.engine.config import EngineConfig
from worker.engine.forward import TargetForward
from worker.engine.grammar import GrammarError, Grammars
from worker.engine.inbox import Abort, AddRequest, ApplyPlan, Inbox, Resize
from worker.engine.kv_cache import bytes_per_block
from worker.engine.logits_cache import LogitsCache
from worker.engine.logprobs import score_pending, take
from worker.engine.model_runner import ModelRunner
from worker.engine.records import StepWork, Verified
from worker.engine.scheduler import Scheduled, Scheduler
from worker.engine.sequence import Sequence
from worker.engine.spec.drafter import Drafter
from worker.engine.spec.memory import ElasticMemory
from worker.engine.spec.pool import DrafterPool
from worker.engine.spec.speculation_plan import SpeculationPlan
from worker.engine.spec.speculator import Feedback, SpecChoice, Speculator
from worker.engine.spec.verify import verify_batch
from worker.engine.step_stats import EngineState, StepRecord, step_stats

log = logging.getLogger(__name__)


class LLMEngine(Engine):
    def __init__(
        self,
        runner: ModelRunner,
        config: EngineConfig,
        eos_token_ids: frozenset[int] = frozenset(),
        drafters: list[Drafter] | None = None,
    ) -> None:
        """``drafters``: model drafters (each with its own runner and KV pool of the target's
        block count) and/or the n-gram drafter; none means the engine never speculates."""
        self.runner, self.config = runner, config
        self.eos_token_ids = frozenset(eos_token_ids)
        self.tokenizer: Any = None  # set by load_engine when the checkpoint has one
        self.weights = ""  # what the target's weights are served as (load_engine: "Q4_1", "float32", ...)
        self.blocks = BlockManager(runner.cache.num_blocks, config.block_size, config.enable_prefix_caching)
        self.logits_cache = LogitsCache(config.logits_cache_size)
        self._inbox = Inbox()
        self._seqs: dict[str, Sequence] = {}  # waiting or running
        self._plan: SpeculationPlan | None = None
        self._step = 0
        pool = DrafterPool(drafters, config.counterfactual_every) if drafters else None
        block_bytes = bytes_per_block(runner.config, config.block_size, runner.dtype)
        self.memory = ElasticMemory(pool.models if pool else [], block_bytes)
        self.spec = Speculator(pool, self.memory, config.max_gamma)
        self.scheduler = Scheduler(  # a sequence it lets go of leaves the drafters too
            self.blocks,
            config.max_num_seqs,
            config.max_num_batched_tokens,
            self._context_limit(),
            on_release=self.spec.free,
        )
        self.forward = TargetForward(runner, self.blocks, self.logits_cache, self.spec)
        self.commit = Commit(self.blocks, self.logits_cache, self.spec, self.scheduler)
        self.grammars = Grammars(runner.config.vocab_size, self.eos_token_ids)  # structured output

    @property
    def drafter_names(self) -> list[str]:
        return list(self.spec.pool.drafters) if self.spec.pool else []

    @property
    def max_model_len(self) -> int:
        return self.scheduler.max_model_len

    # ------------------------------------------------------------ thread-safe API

    def add_request(self, request: EngineRequest) -> None:
        self._inbox.put(AddRequest(request))

    def abort_request(self, request_id: str) -> None:
        self._inbox.put(Abort(request_id))

    def apply_plan(self, plan: SpeculationPlan) -> None:
        self._inbox.put(ApplyPlan(plan))

    def set_num_blocks(self, num_blocks: int) -> None:
        """Grow or shrink the KV pool at the next step; shrinking preempts the newest
        sequences if their blocks cannot otherwise stay."""
        if num_blocks < 2:
            raise ValueError("the KV cache needs at least 2 blocks")
        self._inbox.put(Resize(num_blocks))

    def has_unfinished(self) -> bool:
        return self._inbox.pending_or(lambda: bool(self._seqs))

    def check_integrity(self) -> None:
        """Raise AssertionError unless every block manager's books balance and the target's
        block tables belong to exactly the running sequences (the engine tests call this
        after every step)."""
        self.blocks.check_integrity()
        running = {s.request_id for s in self.scheduler.running}
        assert set(self.blocks.tables) == running, (
            f"block tables {set(self.blocks.tables)} ≠ running {running}"
        )
        for d in self.memory.drafters:
            d.blocks.check_integrity()

    # ------------------------------------------------------------------- the step

    def step(self) -> StepResult:
        t0, queries0, hits0 = time.perf_counter(), self.blocks.prefix_queries, self.blocks.prefix_hits
        touched, memory_events = self._take_inbox()
        memory_events += self._apply_memory()
        choice = self._choose()
        sched = self.scheduler.schedule(num_lookahead=choice.slots)
        work = self._advance(sched.scheduled, choice)
        feedback = self._feedback(choice.drafter if work.drafted.drafts else None, work.verified)
        outputs = self._retire(touched + sched.rejected + [v.seq for v in work.verified] + work.failed)
        state = self._state(time.perf_counter() - t0, queries0, hits0)
        record = StepRecord(self._step, choice, sched, work, feedback, memory_events, state)
        self._step += 1
        return StepResult(outputs, step_stats(record))

    def _choose(self) -> SpecChoice:
        """γ and drafter of the step's decoding sequences, at the batch being formed."""
        running, sched = self.scheduler.running, self.scheduler
        ahead = min(len(running) + len(sched.waiting), sched.max_num_seqs)  # prefilling, waiting too
        return self.spec.choose(self._plan, [s for s in running if not s.prefilling], ahead)

    def _advance(self, scheduled: list[Scheduled], choice: SpecChoice) -> StepWork:
        """draft → forward → verify → commit for the scheduled sequences, or, if any of it
        raises, the failure isolated (see the module docstring)."""
        lengths = [len(s.seq.token_ids) for s in scheduled]
        try:
            self.runner.cache.copy(self.blocks.take_copies())
            drafted = self.spec.draft(choice, scheduled)
            t0 = time.perf_counter()
            forwarded = self.forward(scheduled, drafted.drafts)
            verified = verify_batch(forwarded.candidates, self.eos_token_ids)
            committed = self.commit(scheduled, drafted, forwarded, verified, self.eos_token_ids)
            verify_time = time.perf_counter() - t0
        except Exception as exc:
            return StepWork(failed=self._isolate(scheduled, lengths, exc))
        return StepWork(drafted, verified, committed.kept, committed.prefilled, verify_time)

    def _state(self, step_time: float, queries0: int, hits0: int) -> EngineState:
        """The engine as the step ends, for its stats."""
        return EngineState(
            step_time=step_time,
            contexts=[len(s.token_ids) for s in self.scheduler.running],
            waiting=len(self.scheduler.waiting),
            free_blocks=self.blocks.num_free_blocks,
            total_blocks=self.blocks.num_blocks,
            prefix_queries=self.blocks.prefix_queries - queries0,
            prefix_hits=self.blocks.prefix_hits - hits0,
            draft_resident=self.memory.resident,
            plan_version=self._plan.version if self._plan else 0,
        )

    def _feedback(self, drafter: Drafter | None, verified: list[Verified]) -> Feedback:
        """Acceptance for telemetry; a failure here costs the drafters their state, not a request."""
        try:
            return self.spec.feedback(drafter, verified)
        except Exception:
            log.exception("counterfactual scoring failed; every drafter catches up again")
            self.spec.reset()
            return Feedback()

    def _isolate(self, scheduled: list[Scheduled], lengths: list[int], exc: Exception) -> list[Sequence]:
        """Undo a failed step for its scheduled sequences (see the module docstring); returns
        the one that failed alone, now finished, or none."""
        seqs = [s.seq for s in scheduled]
        log.error("engine step failed on %d sequence(s): %r", len(seqs), exc, exc_info=exc)
        if not seqs:
            raise exc
        for seq, n in zip(seqs, lengths, strict=True):
            del seq.token_ids[n:]  # any token this step's commit appended before it raised
            seq.outcomes.clear()  # only this step's: the steps before were reported
            if seq.grammar is not None:
                seq.grammar.sync(seq.num_output)
            self.scheduler.preempt(seq)  # its drafters' state goes too (on_release)
            seq.suspect = len(seqs) > 1
        if len(seqs) > 1:
            return []
        (seq,) = seqs
        if isinstance(exc, GrammarError):  # the request's constraint failed: its fault (a 400)
            seq.fail(ErrorCode.BAD_REQUEST, f"the request's constraint failed: {exc}"[:2000])
        else:
            seq.fail(
                ErrorCode.ENGINE_ERROR, f"the engine failed on this request: {type(exc).__name__}: {exc}"
            )
        return [seq]

    def _retire(self, touched: list[Sequence]) -> list[RequestOutput]:
        """Drop finished sequences from every structure; one output per touched sequence."""
        for seq in touched:
            if seq.is_finished and self._seqs.get(seq.request_id) is seq:
                del self._seqs[seq.request_id]
                self.scheduler.remove(seq)  # its drafters' state goes too (on_release)
        score_pending([seq.logprobs for seq in touched if seq.logprobs is not None])  # one batch
        return [self._output(seq) for seq in dict.fromkeys(touched)]

    def _output(self, seq: Sequence) -> RequestOutput:
        new = seq.output_token_ids[seq.num_reported :]
        logprobs, prompt_logprobs = take(seq.logprobs, seq.num_reported, seq.num_output, seq.prompt_token_ids)
        seq.num_reported = seq.num_output
        outcomes, seq.outcomes = seq.outcomes, []
        return RequestOutput(
            request_id=seq.request_id,
            new_token_ids=new,
            finished=seq.is_finished,
            finish_reason=seq.finish_reason,
            num_prompt_tokens=seq.num_prompt,
            num_output_tokens=seq.num_output,
            cached_prompt_tokens=seq.num_cached_prompt,
            error=seq.error,
            error_code=seq.error_code,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            outcomes=outcomes,
        )

    # ---------------------------------------------------- inbox and elastic memory

    def _take_inbox(self) -> tuple[list[Sequence], list[MemoryEvent]]:
        """Apply the queued commands: the sequences they finished and the resizes done."""
        touched: list[Sequence] = []
        resizes: list[int] = []
        # Requests move from the inbox to _seqs under its lock, so has_unfinished() never
        # sees a request in neither place.
        with self._inbox.take() as commands:
            for cmd in commands:
                if isinstance(cmd, AddRequest):
                    touched += self._add(cmd.request)
                elif isinstance(cmd, Abort):
                    seq = self._seqs.pop(cmd.request_id, None)
                    if seq is not None:
                        self.scheduler.remove(seq)
                        seq.finish(FinishReason.CANCELLED)
                        touched.append(seq)
                elif isinstance(cmd, ApplyPlan):
                    self._plan = cmd.plan
                else:
                    resizes.append(cmd.num_blocks)
        return touched, [self._resize(n) for n in resizes]

    def _add(self, req: EngineRequest) -> list[Sequence]:
        seq = Sequence(
            req.request_id,
            list(req.prompt_token_ids),
            req.params,
            req.priority,
            req.arrival_time,
            resumed=min(max(req.resumed, 0), len(req.prompt_token_ids)),
        )
        if not seq.prompt_token_ids or req.request_id in self._seqs:
            seq.fail(
                ErrorCode.BAD_REQUEST, "empty prompt" if not seq.prompt_token_ids else "duplicate request id"
            )
            return [seq]
        if req.params.structured is not None and not self.grammars.attach(seq, req, self.tokenizer):
            return [seq]  # a constraint the grammar engine refuses, or one complete already
        self._seqs[seq.request_id] = seq
        self.scheduler.add(seq)
        return []

    def _apply_memory(self) -> list[MemoryEvent]:
        """Advance elastic memory by the plan it returns (drafters' state, the pool size)."""
        plan = self.memory.plan(bool(self._plan and self._plan.offload), self.blocks.num_blocks)
        if plan.release_drafters:
            self.spec.reset()
        resized = self._resize(plan.resize_to) if plan.resize_to is not None else None
        return self.memory.record(plan, resized)

    def _resize(self, num_blocks: int) -> MemoryEvent:
        t0 = time.perf_counter()
        old = self.blocks.num_blocks
        moves, preempted = self.scheduler.resize(num_blocks)  # preempting where blocks must go
        self.runner.cache.resize(num_blocks, moves)
        self.scheduler.max_model_len = self._context_limit()
        return MemoryEvent(
            kind="kv_resize",
            seconds=time.perf_counter() - t0,
            from_blocks=old,
            to_blocks=num_blocks,
            moved_blocks=len(moves),
            preempted=preempted,
        )

    def _context_limit(self) -> int:
        # One block stays spare so a copy-on-write never finds the pool exactly full.
        capacity = (self.runner.cache.num_blocks - 1) * self.config.block_size
        limits = [self.runner.config.max_model_len, capacity]
        if self.config.max_model_len:
            limits.append(self.config.max_model_len)
        return min(limits)
