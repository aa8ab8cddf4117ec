"""Continuous batching: which sequences compute how many tokens this step.

Running sequences go first, in priority order (lower value first, then FCFS); each computes
its uncomputed tokens (1 while decoding; a chunk of at most the remaining token budget while
prefilling). When KV blocks run out, the newest lowest-priority running sequence is
preempted by recompute: its blocks are freed and it waits again, ahead of later arrivals,
with prompt + generated tokens to recompute (the prefix cache often still holds them).
Waiting sequences are then admitted in order while the token budget, the sequence limit
and the free blocks allow; the first that does not fit stops admission (no overtaking).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from worker.engine.block_manager import BlockManager
from worker.engine.sequence import Sequence, Status


@dataclass
class Scheduled:
    seq: Sequence
    num_new: int  # tokens to compute this step (0: an exact repeat sampled from stored logits)
    num_lookahead: int = 0  # extra slots reserved after them for draft tokens to verify


@dataclass
class SchedulerOutput:
    scheduled: list[Scheduled] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    rejected: list[Sequence] = field(default_factory=list)  # finished here (cannot ever fit)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new for s in self.scheduled)


class Scheduler:
    def __init__(
        self,
        blocks: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        lookup_logits: Callable[[list[int]], torch.Tensor | None],
    ) -> None:
        self.blocks = blocks
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.lookup_logits = lookup_logits
        self.waiting: list[Sequence] = []  # sorted by Sequence.sort_key
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        seq.status = Status.WAITING
        bisect.insort(self.waiting, seq, key=Sequence.sort_key)

    def remove(self, seq: Sequence) -> None:
        """Take a sequence out of the schedule and free its blocks (finish or abort)."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        else:
            return
        self.blocks.free(seq.request_id)

    def preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.blocks.free(seq.request_id)
        seq.reset_for_recompute()
        self.add(seq)

    def schedule(self, num_lookahead: int = 0) -> SchedulerOutput:
        """Plan one step. ``num_lookahead`` (γ) reserves up to that many more slots (and
        budget tokens) after each decoding sequence's last token, for drafts to be verified;
        fewer where γ+1 emitted tokens would pass max_tokens or the longest context."""
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        for seq in sorted(self.running, key=Sequence.sort_key):
            if seq.status is not Status.RUNNING:
                continue  # preempted earlier in this pass
            n = min(seq.num_uncomputed, budget)
            if n == 0:
                break
            extra = 0
            if not seq.prefilling and num_lookahead:
                # All γ drafts accepted emit γ+1 tokens: stay within max_tokens and the context.
                room = min(self.max_model_len - len(seq.token_ids), seq.params.max_tokens - seq.num_output)
                extra = max(0, min(num_lookahead, budget - n, room - 1))
            end = seq.num_computed + n + extra
            while not self.blocks.allocate(seq.request_id, seq.num_computed, end):
                # Scheduled sequences sort before seq, so the victim is never one of them.
                victim = max(self.running, key=Sequence.sort_key)
                self.preempt(victim)
                out.preempted.append(victim)
                if victim is seq:
                    break
            else:
                out.scheduled.append(Scheduled(seq, n, extra))
                budget -= n + extra
        if out.preempted:
            return out  # blocks are short: admitting more now would only thrash
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if len(seq.token_ids) >= self.max_model_len:
                self.waiting.pop(0)
                self._reject(seq)
                out.rejected.append(seq)
                continue
            chunk = self._admit(seq, budget)
            if chunk is None:
                break
            self.waiting.pop(0)
            seq.status = Status.RUNNING
            self.running.append(seq)
            out.scheduled.append(Scheduled(seq, chunk))
            budget -= chunk
        return out

    def _admit(self, seq: Sequence, budget: int) -> int | None:
        """Attach cached blocks and allocate the first chunk; None if it does not fit now."""
        tokens = seq.token_ids
        matched = self.blocks.match_prefix(seq.request_id, tokens)
        logits = self.lookup_logits(tokens) if matched == len(tokens) else None
        seq.num_computed = len(tokens) if logits is not None else min(matched, len(tokens) - 1)
        n = min(seq.num_uncomputed, budget)
        if n and not self.blocks.allocate(seq.request_id, seq.num_computed, seq.num_computed + n):
            self.blocks.free(seq.request_id)
            self.blocks.forget_query(len(tokens), matched)
            seq.num_computed = 0
            return None
        seq.cached_logits = logits
        seq.prefilling = True
        if not seq.admitted:
            seq.admitted = True
            seq.num_cached_prompt = min(matched, seq.num_prompt)
        return n

    def _reject(self, seq: Sequence) -> None:
        self.blocks.free(seq.request_id)
        if seq.num_output > 0:
            seq.finish("length")  # grew to the largest context this cache can hold
        else:
            seq.finish(
                "error",
                f"prompt of {seq.num_prompt} tokens does not fit: this engine serves at most "
                f"{self.max_model_len} tokens per sequence (prompt + output)",
            )
