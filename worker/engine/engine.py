"""LLMEngine: continuous batching over a paged KV cache with exact prefix reuse, and
speculative decoding with a per-step γ, a drafter pool and elastic draft memory.

A step reads top to bottom: take the inbox (inbox.py) → elastic memory (a plan it applies)
→ schedule → draft → run → verify → postprocess → feedback → outputs and one ``StepStats``.
Each phase returns named records (records.py); none fills in an argument.

Speculation (worker/engine/spec/): γ comes from the latest planner decision at the batch
size of decoding sequences; the scheduler reserves γ slots after each decoding sequence, the
active drafter appends its drafts, and one target forward computes γ+1 rows per decoding
sequence next to the prefill chunks of others. Verification (greedy, keyed draws for seeded
sampling, rejection sampling for unseeded: spec/verify.py) emits 1..γ+1 tokens per sequence;
rejected drafts are rolled back in the target (``Sequence.truncate`` +
``BlockManager.truncate``) and in every drafter. γ = 0 runs no draft work at all.

Failure isolation: when draft, run, verify or postprocess raises, every scheduled sequence
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

from shared.control import Decision, MemoryEvent
from shared.errors import ErrorCode
from worker.engine.api import Engine, EngineRequest, RequestOutput, StepResult, StepStats
from worker.engine.block_manager import BlockManager
from worker.engine.config import EngineConfig
from worker.engine.forward import TargetForward
from worker.engine.grammar import GrammarError, Grammars
from worker.engine.inbox import Abort, AddRequest, ApplyDecision, Inbox, Resize
from worker.engine.kv_cache import bytes_per_block
from worker.engine.logits_cache import LogitsCache
from worker.engine.logprobs import record_output, score_pending, take
from worker.engine.model_runner import ModelRunner
from worker.engine.records import StepWork, Verified
from worker.engine.scheduler import Scheduled, Scheduler
from worker.engine.sequence import Sequence
from worker.engine.spec.drafter import Drafter
from worker.engine.spec.memory import ElasticMemory
from worker.engine.spec.pool import DrafterPool
from worker.engine.spec.speculator import Feedback, SpecChoice, Speculator
from worker.engine.spec.verify import verify_batch

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
        self.scheduler = Scheduler(
            self.blocks, config.max_num_seqs, config.max_num_batched_tokens, self._context_limit()
        )
        self._inbox = Inbox()
        self._seqs: dict[str, Sequence] = {}  # waiting or running
        self._decision: Decision | None = None
        self._step = 0
        pool = DrafterPool(drafters, config.counterfactual_every) if drafters else None
        block_bytes = bytes_per_block(runner.config, config.block_size, runner.dtype)
        self.memory = ElasticMemory(pool.models if pool else [], block_bytes)
        self.spec = Speculator(pool, self.memory, config.max_gamma)
        self.forward = TargetForward(runner, self.blocks, self.logits_cache, self.spec)
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

    def apply_decision(self, decision: Decision) -> None:
        self._inbox.put(ApplyDecision(decision))

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
        t0 = time.perf_counter()
        queries0, hits0 = self.blocks.prefix_queries, self.blocks.prefix_hits
        touched, memory_events = self._take_inbox()
        memory_events += self._apply_memory()
        running, sched = self.scheduler.running, self.scheduler
        ahead = min(len(running) + len(sched.waiting), sched.max_num_seqs)  # the batch being formed
        choice = self.spec.choose(self._decision, [s for s in running if not s.prefilling], ahead)
        plan = self.scheduler.schedule(num_lookahead=choice.slots)
        for seq in plan.preempted:
            self.spec.free(seq.request_id)
        work = self._advance(plan.scheduled, choice)
        feedback = self._feedback(choice.drafter if work.drafted.drafts else None, work.verified)
        outputs = self._retire(touched + plan.rejected + [v.seq for v in work.verified] + work.failed)
        running, drafted = self.scheduler.running, work.drafted
        step_time = time.perf_counter() - t0
        stats = StepStats(
            step=self._step,
            batch_size=sum(1 for v in work.verified if not v.candidate.scheduled.prefill),
            prefill_tokens=work.prefilled,
            num_tokens=work.kept,
            gamma=choice.gamma if drafted.drafts else 0,
            drafter=drafted.drafter,
            drafter_shares=drafted.shares,
            step_time=step_time,
            draft_time=drafted.seconds,
            verify_time=work.verify_time,
            other_time=step_time - work.verify_time - drafted.seconds,
            counterfactual_time=feedback.seconds + choice.prompt_seconds,
            prompts_scored=choice.prompts_scored,
            proposed=drafted.proposed,
            accepted=feedback.accepted,
            num_drafts=feedback.drafts,
            accepted_per_pos=feedback.per_pos,
            counterfactual=feedback.counterfactual,
            lookahead=feedback.lookahead,
            mean_context=sum(len(s.token_ids) for s in running) / len(running) if running else 0.0,
            running=len(running),
            waiting=len(self.scheduler.waiting),
            free_blocks=self.blocks.num_free_blocks,
            total_blocks=self.blocks.num_blocks,
            draft_resident=self.memory.resident,
            switch_costs=drafted.switch_costs,
            prefix_queries=self.blocks.prefix_queries - queries0,
            prefix_hits=self.blocks.prefix_hits - hits0,
            preempted=len(plan.preempted),
            failed=len(work.failed),
            decision_version=self._decision.version if self._decision else 0,
            memory_events=memory_events,
        )
        self._step += 1
        return StepResult(outputs, stats)

    def _advance(self, scheduled: list[Scheduled], choice: SpecChoice) -> StepWork:
        """draft → run → verify → postprocess for the scheduled sequences, or, if any of it
        raises, the failure isolated (see the module docstring)."""
        lengths = [len(s.seq.token_ids) for s in scheduled]
        try:
            self.runner.cache.copy(self.blocks.take_copies())
            drafted = self.spec.draft(choice, scheduled)
            t0 = time.perf_counter()
            verified = verify_batch(self.forward(scheduled, drafted.drafts), self.eos_token_ids)
            kept = self._postprocess(scheduled, verified)
            verify_time = time.perf_counter() - t0
        except Exception as exc:
            return StepWork(failed=self._isolate(scheduled, lengths, exc))
        for s in scheduled:
            if s.seq.suspect and not s.prefill:
                s.seq.suspect = False  # a decoding step of its own went through: cleared
        cached = sum(1 for v in verified if v.candidate.from_cache)  # exact repeats computed nothing
        prefilled = sum(s.num_new for s in scheduled if s.prefill) - cached
        return StepWork(drafted, verified, kept, prefilled, verify_time)

    def _postprocess(self, scheduled: list[Scheduled], verified: list[Verified]) -> int:
        """Apply the step to every scheduled sequence: its computed tokens, the kept tokens
        of a verification (rejected drafts leave every cache), its finish. Returns the
        number of tokens emitted."""
        for s in scheduled:
            s.seq.num_computed += s.num_new
        with_rows = {id(v.candidate.scheduled) for v in verified}
        for s in scheduled:
            if id(s) not in with_rows:  # a prompt chunk in the middle of the prompt
                self.blocks.commit(s.seq.request_id, s.seq.token_ids, s.seq.num_computed)
        return sum(self._apply(v) for v in verified)

    def _apply(self, v: Verified) -> int:
        seq, d, out = v.seq, v.drafted, v.emitted
        start = len(seq.token_ids) - (len(d.tokens) if d else 0)
        keep = self._keep(seq, start, out)
        seq.outcomes.append(v.outcome(keep))
        record_output(seq.logprobs, start - seq.num_prompt, v.candidate.logits, out[:keep])
        if d is not None:
            seq.truncate(start + keep - 1)
            self.blocks.truncate(seq.request_id, start + keep - 1)
            self.spec.rollback(seq.request_id, start + keep - 1)
        self.blocks.commit(seq.request_id, seq.token_ids, seq.num_computed)
        if seq.prefilling:
            if not v.candidate.from_cache:  # freshly computed: keep it for an exact repeat
                self.logits_cache.put(seq.token_ids, v.candidate.logits[-1])
                self.blocks.cache_tail(seq.request_id, seq.token_ids)
            seq.prefilling = False
        seq.append(out[keep - 1])
        self._check_finished(seq, out[keep - 1])
        return keep

    def _keep(self, seq: Sequence, start: int, out: list[int]) -> int:
        """How many of the emitted tokens stand: up to the first EOS, within max_tokens and
        the longest context (the scheduler's γ caps make the last two hold already)."""
        keep = len(out)
        if not seq.params.ignore_eos:
            keep = next((j + 1 for j, t in enumerate(out) if t in self.eos_token_ids), keep)
        room = min(seq.params.max_tokens - (start - seq.num_prompt), self.scheduler.max_model_len - start)
        keep = max(1, min(keep, room))
        return seq.grammar.accept(out[:keep]) if seq.grammar is not None else keep  # cut at its end

    def _check_finished(self, seq: Sequence, token: int) -> None:
        ended = seq.grammar is not None and seq.grammar.done
        if ended or (token in self.eos_token_ids and not seq.params.ignore_eos):
            seq.finish("stop")
        elif seq.num_output >= seq.params.max_tokens or len(seq.token_ids) >= self.scheduler.max_model_len:
            seq.finish("length")

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
            del seq.token_ids[n:]  # drafts, and any token this step appended
            seq.outcomes.clear()  # only this step's: the steps before were reported
            if seq.grammar is not None:
                seq.grammar.sync(seq.num_output)
            self.scheduler.preempt(seq)
            self.spec.free(seq.request_id)
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
                self.scheduler.remove(seq)
                self.spec.free(seq.request_id)
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
                        self.spec.free(seq.request_id)
                        seq.finish("cancelled")
                        touched.append(seq)
                elif isinstance(cmd, ApplyDecision):
                    self._decision = cmd.decision
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
        plan = self.memory.plan(bool(self._decision and self._decision.offload), self.blocks.num_blocks)
        if plan.release_drafters:
            self.spec.reset()
        resized = self._resize(plan.resize_to) if plan.resize_to is not None else None
        return self.memory.record(plan, resized)

    def _resize(self, num_blocks: int) -> MemoryEvent:
        t0 = time.perf_counter()
        old, preempted = self.blocks.num_blocks, 0
        while True:
            try:
                moves = self.blocks.resize(num_blocks)
                break
            except ValueError:
                if not self.scheduler.running:
                    raise
                victim = max(self.scheduler.running, key=Sequence.sort_key)
                self.scheduler.preempt(victim)
                self.spec.free(victim.request_id)
                preempted += 1
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
