"""The step's forward phase: one target forward over every scheduled sequence, as candidates.

schedule → draft → **forward** → verify → commit (engine.py). Each scheduled sequence feeds
its uncomputed tokens (a prompt chunk, a decode's last token, or that token and its drafts,
which the sequence does not hold yet: commit appends the ones that stand) at its position,
through its block table; the runner computes them in one batched forward and returns logits
only for the rows asked for. A feature drafter, when resident, gets the target's last hidden
states of every computed row (``Speculator.observe``); a request that asks for prompt
logprobs gets the rows of its prompt chunks back (``PromptRows``), for commit to score
(logprobs.py). Nothing of a sequence changes here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from worker.engine.block_manager import BlockManager
from worker.engine.logits_cache import LogitsCache
from worker.engine.model_runner import ForwardItem, ModelRunner
from worker.engine.records import Candidate, Drafted, PromptRows
from worker.engine.scheduler import Scheduled
from worker.engine.spec.speculator import Speculator


@dataclass
class Forwarded:
    """What the target forward computed: the candidates and the prompt rows to score."""

    candidates: list[Candidate] = field(default_factory=list)
    prompt_rows: list[PromptRows] = field(default_factory=list)


@dataclass
class TargetForward:
    runner: ModelRunner
    blocks: BlockManager
    logits_cache: LogitsCache
    spec: Speculator

    def __call__(self, scheduled: list[Scheduled], drafts: dict[str, Drafted]) -> Forwarded:
        """The target forward. A candidate per sequence that gets tokens this step: γ+1 rows
        for a verification, one for a decode or a prompt's end; an exact repeat of a prompt
        whose next-token logits are stored (RAKV-ASD) takes them from ``logits_cache`` and
        skips the forward. A prompt chunk that ends before the prompt does gets none."""
        slots: list[Candidate | int] = []  # per sequence with rows: its candidate, or its item
        items: list[ForwardItem] = []
        owners: list[Scheduled] = []
        wants: list[int] = []  # per item: its candidate's rows (more rows: prompt logprobs)
        for s in scheduled:
            seq, start = s.seq, s.seq.num_computed
            if s.exact and (stored := self.logits_cache.get(seq.token_ids)) is not None:
                row = stored.unsqueeze(0)
                slots.append(Candidate(s, row, row.argmax(-1).tolist(), from_cache=True))
                continue
            end = start + s.num_new
            d = drafts.get(seq.request_id)
            feed = seq.token_ids[start:end] + d.tokens if d is not None else seq.token_ids[start:end]
            wanted = 0 if end < len(seq.token_ids) else 1 if s.prefill else len(feed)
            n_rows = s.num_new if s.prefill and seq.wants_prompt_logprobs else wanted
            if n_rows:
                slots.append(len(items))
            table = self.blocks.table(seq.request_id)
            items.append(ForwardItem(feed, start, table, n_rows))
            owners.append(s)
            wants.append(wanted)
        if items and self.spec.wants_features():
            # A feature drafter reads the target's last hidden states of every computed row.
            logits, first, feats = self.runner.run_with_features(items)
            for s, item, rows in zip(owners, items, feats, strict=True):
                self.spec.observe(s.seq.request_id, item.start, rows)
        elif items:
            logits, first = self.runner.run(items)
        if items:
            ids = logits.argmax(-1).tolist()  # one pass over every row; greedy rows use it
        out = Forwarded()
        candidates = out.candidates
        for slot in slots:
            if isinstance(slot, Candidate):
                candidates.append(slot)
                continue
            s, f, w = owners[slot], first[slot], wants[slot]
            end = f + items[slot].num_logits
            if s.seq.logprobs is not None and items[slot].num_logits > w:  # rows scoring prompt tokens
                out.prompt_rows.append(PromptRows(s.seq, items[slot].start, logits[f:end]))
            if w:
                candidates.append(
                    Candidate(s, logits[end - w : end], ids[end - w : end], drafts.get(s.seq.request_id))
                )
        return out
