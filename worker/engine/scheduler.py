"""Continuous batching: which sequences compute how many tokens this step.

Running sequences go first, in priority order (lower value first, then FCFS); each computes
its uncomputed tokens (1 while decoding; a chunk of at most the remaining token budget while
prefilling). When KV blocks run out, the newest lowest-priority running sequence is
preempted by recompute: its blocks are freed and it waits again, ahead of later arrivals,
with prompt + generated tokens to recompute (the prefix cache often still holds them).
Waiting sequences are then admitted in order while the token budget, the sequence limit
and the free blocks allow; the first that does not fit stops admission (no overtaking).

Suspects (``Sequence.suspect``: they were in a batch the engine failed on) run alone, one at
a time and nothing beside them, until the engine clears or fails each one; see engine.py.

Every preemption is the scheduler's: when blocks run short in ``schedule``, when the pool
shrinks (``resize``), and when the engine hands back the sequences of a failed step
(``preempt``). Whenever a sequence leaves the schedule (finished, aborted or preempted) its
target blocks are freed here and ``on_release`` is told its id (the engine's drafters drop
their state of it).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from shared.errors import ErrorCode
from shared.schemas import FinishReason
from worker.engine.block_manager import BlockManager
from worker.engine.sequence import Sequence, Status


@dataclass
class Scheduled:
    seq: Sequence
    num_new: int  # tokens to compute this step (drafts, once appended, count too)
    num_lookahead: int = 0  # extra slots reserved after them for draft tokens to verify
    exact: bool = False  # admitted with every token's KV already cached (an exact repeat)
    prefill: bool = field(init=False)  # the sequence is (re)computing its tokens this step

    def __post_init__(self) -> None:
        self.prefill = self.seq.prefilling


@dataclass
class SchedulerOutput:
    scheduled: list[Scheduled] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    rejected: list[Sequence] = field(default_factory=list)  # finished here (cannot ever fit)


class Scheduler:
    def __init__(
        self,
        blocks: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        on_release: Callable[[str], None] | None = None,
    ) -> None:
        self.blocks = blocks
        self.on_release = on_release  # told each request id whose state is dropped
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.waiting: list[Sequence] = []  # sorted by Sequence.sort_key
        self.running: list[Sequence] = []
        self._lookahead: int | Mapping[str, int] = 0  # of the step being scheduled

    def add(self, seq: Sequence) -> None:
        seq.status = Status.WAITING
        bisect.insort(self.waiting, seq, key=Sequence.sort_key)

    def remove(self, seq: Sequence) -> None:
        """Take a sequence out of the schedule and free its blocks (finish or abort); its
        release is told in any case (a sequence finished while waiting may hold drafter state)."""
        if seq in self.running:
            self.running.remove(seq)
            self.blocks.free(seq.request_id)
        elif seq in self.waiting:
            self.waiting.remove(seq)
            self.blocks.free(seq.request_id)
        self._release(seq)

    def preempt(self, seq: Sequence) -> None:
        """Preempt a running sequence by recompute: its blocks freed, it waits again."""
        self.running.remove(seq)
        self.blocks.free(seq.request_id)
        seq.reset_for_recompute()
        self.add(seq)
        self._release(seq)

    def resize(self, num_blocks: int) -> tuple[list[tuple[int, int]], int]:
        """Resize the block pool, preempting the newest running sequences while their blocks
        cannot otherwise stay; the block moves (for the KV cache) and how many were preempted."""
        preempted = 0
        while True:
            try:
                return self.blocks.resize(num_blocks), preempted
            except ValueError:
                if not self.running:
                    raise
                self.preempt(max(self.running, key=Sequence.sort_key))
                preempted += 1

    def _release(self, seq: Sequence) -> None:
        if self.on_release is not None:
            self.on_release(seq.request_id)

    def schedule(self, num_lookahead: int | Mapping[str, int] = 0) -> SchedulerOutput:
        """Plan one step. ``num_lookahead`` (γ, for every decoding sequence or per request id)
        reserves up to that many more slots (and budget tokens) after each decoding sequence's
        last token, for drafts to be verified; fewer where γ+1 emitted tokens would pass
        max_tokens or the longest context."""
        self._lookahead = num_lookahead
        suspect = self._next_suspect()
        if suspect is not None:
            return self._schedule_alone(suspect)
        scheduled: list[Scheduled] = []
        preempted: list[Sequence] = []
        budget = self.max_num_batched_tokens
        for seq in sorted(self.running, key=Sequence.sort_key):
            if seq.status is not Status.RUNNING:
                continue  # preempted earlier in this pass
            n = min(seq.num_uncomputed, budget)
            if n == 0:
                break
            s, gone = self._schedule_running(seq, n, budget)
            preempted += gone
            if s is not None:
                scheduled.append(s)
                budget -= s.num_new + s.num_lookahead
        if preempted:
            return SchedulerOutput(scheduled, preempted)  # blocks are short: admitting would thrash
        rejected: list[Sequence] = []
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if self._reject(seq):
                rejected.append(seq)
                continue
            s = self._admit(seq, budget)
            if s is None:
                break
            scheduled.append(s)
            budget -= s.num_new
        return SchedulerOutput(scheduled, preempted, rejected)

    def _schedule_running(
        self, seq: Sequence, n: int, budget: int
    ) -> tuple[Scheduled | None, list[Sequence]]:
        """Schedule ``n`` tokens (+ draft slots) of a running sequence, preempting the newest
        running sequences while blocks are short: its ``Scheduled`` (None if ``seq`` itself
        went) and the sequences preempted, in order."""
        la = self._lookahead
        lookahead = la if isinstance(la, int) else la.get(seq.request_id, 0)
        extra = 0
        if not seq.prefilling and lookahead:
            # All γ drafts accepted emit γ+1 tokens: stay within max_tokens and the context.
            room = min(self.max_model_len - len(seq.token_ids), seq.params.max_tokens - seq.num_output)
            extra = max(0, min(lookahead, budget - n, room - 1))
        end = seq.num_computed + n + extra
        preempted: list[Sequence] = []
        while not self.blocks.allocate(seq.request_id, seq.num_computed, end):
            # Scheduled sequences sort before seq, so the victim is never one of them.
            victim = max(self.running, key=Sequence.sort_key)
            self.preempt(victim)
            preempted.append(victim)
            if victim is seq:
                return None, preempted
        return Scheduled(seq, n, extra), preempted

    def _next_suspect(self) -> Sequence | None:
        running = [s for s in self.running if s.suspect]
        if running:
            return running[0]
        return next((s for s in self.waiting if s.suspect), None)

    def _schedule_alone(self, seq: Sequence) -> SchedulerOutput:
        """Only ``seq`` this step; other running sequences give up their blocks if it needs them."""
        budget = self.max_num_batched_tokens
        preempted: list[Sequence] = []
        if seq.status is Status.RUNNING:
            n = min(seq.num_uncomputed, budget)
            while not self._fits(seq, n) and len(self.running) > 1:
                preempted.append(self._preempt_newest_but(seq))
            s, gone = self._schedule_running(seq, n, budget)
            return SchedulerOutput([s] if s is not None else [], preempted + gone)
        if self._reject(seq):
            return SchedulerOutput(rejected=[seq])
        while self.running and len(self.running) >= self.max_num_seqs:
            preempted.append(self._preempt_newest_but(seq))
        while (s := self._admit(seq, budget)) is None and self.running:
            preempted.append(self._preempt_newest_but(seq))
        return SchedulerOutput([s] if s is not None else [], preempted)

    def _fits(self, seq: Sequence, n: int) -> bool:
        needed = self.blocks.blocks_needed(seq.request_id, seq.num_computed, seq.num_computed + n)
        return needed <= self.blocks.num_free_blocks

    def _preempt_newest_but(self, seq: Sequence) -> Sequence:
        victim = max((s for s in self.running if s is not seq), key=Sequence.sort_key)
        self.preempt(victim)
        return victim

    def _reject(self, seq: Sequence) -> bool:
        """Finish a waiting sequence (the first) that no cache of this size can ever hold;
        whether it did."""
        if len(seq.token_ids) < self.max_model_len:
            return False
        self.waiting.remove(seq)
        self.blocks.free(seq.request_id)
        if seq.num_output > 0:
            seq.finish(FinishReason.LENGTH)  # grew to the largest context this cache can hold
        else:
            seq.fail(
                ErrorCode.CONTEXT_LENGTH_EXCEEDED,
                f"prompt of {seq.num_prompt} tokens does not fit: this engine serves at most "
                f"{self.max_model_len} tokens per sequence (prompt + output)",
            )
        return True

    def _admit(self, seq: Sequence, budget: int) -> Scheduled | None:
        """Attach cached blocks and allocate the first chunk; None if it does not fit now.
        The last token is always computed again unless the engine serves an exact repeat
        (every token's KV cached: ``Scheduled.exact``) from stored logits."""
        tokens = seq.token_ids
        matched = self.blocks.match_prefix(seq.request_id, tokens, reuse=not seq.wants_prompt_logprobs)
        seq.num_computed = min(matched, len(tokens) - 1)
        n = min(seq.num_uncomputed, budget)
        if not self.blocks.allocate(seq.request_id, seq.num_computed, seq.num_computed + n):
            self.blocks.free(seq.request_id)
            self.blocks.forget_query(len(tokens), matched)
            seq.num_computed = 0
            return None
        self.waiting.remove(seq)
        seq.status = Status.RUNNING
        self.running.append(seq)
        seq.prefilling = True
        if not seq.admitted:
            seq.admitted = True
            seq.num_cached_prompt = min(matched, seq.num_prompt)
        return Scheduled(seq, n, exact=matched == len(tokens))
