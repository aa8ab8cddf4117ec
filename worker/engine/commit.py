"""The step's commit phase: the one place where a step's results change the sequences'
tokens, computed counts and finishes, the target's blocks and the logits cache, and where the
drafters' caches are cut back to what stands.

schedule → draft → forward → verify → **commit** (engine.py). Before it the phases leave
those alone (the scheduler's allocations and preemptions aside; speculation's own bookkeeping
— cost-rule state, learners, the drafters' proposal forwards — and an unseeded sequence's
generator do move: docs/architecture.md "The engine"); commit then, for every scheduled
sequence:

- counts its computed tokens (a decode's drafts included) and scores the prompt rows the
  forward returned (logprobs.py);
- registers the full blocks of a prompt chunk that ends inside the prompt (prefix cache);
- for each verified sequence, keeps the emitted tokens that stand (up to the first EOS,
  within ``max_tokens``, the context and the grammar), appends the accepted drafts and the
  target's token, cuts the rejected drafts' KV from the target's blocks and from every
  drafter (``Speculator.rollback``), stores a prompt's next-token logits for an exact repeat,
  and finishes the sequence where it stops;
- clears the suspects whose decoding step of their own went through.

A raise in here is isolated like one in any earlier phase (engine.py ``_isolate``).
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.schemas import FinishReason
from worker.engine.block_manager import BlockManager
from worker.engine.forward import Forwarded
from worker.engine.logits_cache import LogitsCache
from worker.engine.logprobs import record_output, record_prompt
from worker.engine.records import DraftRound, Verified
from worker.engine.scheduler import Scheduled, Scheduler
from worker.engine.sequence import Sequence
from worker.engine.spec.speculator import Speculator


@dataclass(frozen=True)
class Committed:
    """What commit applied."""

    kept: int  # tokens emitted
    prefilled: int  # prompt tokens computed (exact repeats served from stored logits excluded)


@dataclass
class Commit:
    blocks: BlockManager
    logits_cache: LogitsCache
    spec: Speculator
    scheduler: Scheduler  # read only: its longest context now (a pool resize changes it)

    def __call__(
        self,
        scheduled: list[Scheduled],
        drafted: DraftRound,
        forwarded: Forwarded,
        verified: list[Verified],
        eos: frozenset[int],
    ) -> Committed:
        """Apply the step to every scheduled sequence (see the module docstring); ``eos``: the
        engine's EOS tokens now."""
        for p in forwarded.prompt_rows:
            assert p.seq.logprobs is not None
            record_prompt(p.seq.logprobs, p.seq.prompt_token_ids, p.start, p.rows)
        for s in scheduled:
            d = drafted.drafts.get(s.seq.request_id)
            s.seq.num_computed += s.num_new + (len(d.tokens) if d is not None else 0)
        with_rows = {id(v.candidate.scheduled) for v in verified}
        for s in scheduled:
            if id(s) not in with_rows:  # a prompt chunk in the middle of the prompt
                self.blocks.commit(s.seq.request_id, s.seq.token_ids, s.seq.num_computed)
        kept = sum(self._apply(v, eos) for v in verified)
        for s in scheduled:
            if s.seq.suspect and not s.prefill:
                s.seq.suspect = False  # a decoding step of its own went through: cleared
        cached = sum(1 for v in verified if v.candidate.from_cache)  # exact repeats computed nothing
        prefilled = sum(s.num_new for s in scheduled if s.prefill) - cached
        return Committed(kept, prefilled)

    def _apply(self, v: Verified, eos: frozenset[int]) -> int:
        """One verified sequence's tokens that stand, into it and its caches; how many."""
        seq, d, out = v.seq, v.drafted, v.emitted
        start = len(seq.token_ids)  # its drafts (if any) were fed after these, never held
        keep = self._keep(seq, start, out, eos)
        seq.outcomes.append(v.outcome(keep))
        record_output(seq.logprobs, start - seq.num_prompt, v.candidate.logits, out[:keep])
        if d is not None:
            seq.token_ids.extend(d.tokens[: keep - 1])  # the accepted drafts that stand
            seq.truncate(start + keep - 1)  # computed up to them: the rest was rejected
            self.blocks.truncate(seq.request_id, start + keep - 1)
            self.spec.rollback(seq.request_id, start + keep - 1)
        self.blocks.commit(seq.request_id, seq.token_ids, seq.num_computed)
        if seq.prefilling:
            if not v.candidate.from_cache:  # freshly computed: keep it for an exact repeat
                self.logits_cache.put(seq.token_ids, v.candidate.logits[-1])
                self.blocks.cache_tail(seq.request_id, seq.token_ids)
            seq.prefilling = False
        seq.append(out[keep - 1])
        self._check_finished(seq, out[keep - 1], eos)
        return keep

    def _keep(self, seq: Sequence, start: int, out: list[int], eos: frozenset[int]) -> int:
        """How many of the emitted tokens stand: up to the first EOS, within max_tokens and
        the longest context (the scheduler's γ caps make the last two hold already)."""
        keep = len(out)
        if not seq.params.ignore_eos:
            keep = next((j + 1 for j, t in enumerate(out) if t in eos), keep)
        room = min(seq.params.max_tokens - (start - seq.num_prompt), self.scheduler.max_model_len - start)
        keep = max(1, min(keep, room))
        return seq.grammar.accept(out[:keep]) if seq.grammar is not None else keep  # cut at its end

    def _check_finished(self, seq: Sequence, token: int, eos: frozenset[int]) -> None:
        ended = seq.grammar is not None and seq.grammar.done
        if ended or (token in eos and not seq.params.ignore_eos):
            seq.finish(FinishReason.STOP)
        elif seq.num_output >= seq.params.max_tokens or len(seq.token_ids) >= self.scheduler.max_model_len:
            seq.finish(FinishReason.LENGTH)
