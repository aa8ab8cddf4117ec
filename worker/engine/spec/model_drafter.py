"""A drafter that is a (small) model with its own paged KV.

It owns a ``ModelRunner`` (weights + ``KVCache``) and a ``BlockManager`` with prefix caching
off, keyed by the target's request ids, and remembers per sequence how many leading tokens
its cache holds. Every call feeds what is missing since then, so catching up after steps
without speculation, the prompt of a sequence that just finished prefilling, and the
verified tokens of a counterfactual all run through one chunked, batched ``_feed``.

Drafts are argmax for greedy sequences. A seeded sampled sequence's draft is the keyed draw
(keyed.py) from the drafter's warped distribution (``sampler.filtered_probs``, the same
warping as the target's) with the noise of the draft's output position, the noise the target
draws that position with: a coupled draft, the target's own token wherever the two races have
the same winner (its verification compares tokens). An unseeded one draws with the sequence's
own generator, and the draw's probabilities go to rejection sampling as q. Both keep q (a view
of rows computed anyway): benchmarks/seeded_bench.py measures on it what rejection sampling
would have accepted of a seeded sequence's drafts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from worker.engine.block_manager import BlockManager
from worker.engine.kv_cache import bytes_per_block
from worker.engine.model_runner import ForwardItem, ModelRunner
from worker.engine.sampler import draw, filtered_probs
from worker.engine.sequence import Sequence
from worker.engine.spec.drafter import CatchUp, ChainDrafts, Drafter, Proposal, Scores

PROMPT_CONTEXT = 32  # tokens of context before the scored positions of the prompt prior
SCRATCH = "\x00prompt-"  # the prompt prior's scratch entries (no request id starts so)


@dataclass
class _Job:
    seq_id: str
    tokens: list[int]  # tokens to compute, at positions start, start + 1, ...
    start: int
    num_logits: int  # rows wanted: the last ones


class ModelDrafter(Drafter):
    def __init__(self, name: str, runner: ModelRunner, max_batched_tokens: int = 512) -> None:
        self.name, self.runner = name, runner
        self.num_blocks = runner.cache.num_blocks
        self.max_batched_tokens = max_batched_tokens
        self.blocks = BlockManager(self.num_blocks, runner.block_size, enable_prefix_caching=False)
        self.computed: dict[str, int] = {}  # leading tokens of a sequence in this drafter's cache

    @property
    def weight_bytes(self) -> int:
        return self.runner.weight_bytes

    @property
    def kv_bytes(self) -> int:
        r = self.runner
        return bytes_per_block(r.config, r.block_size, r.dtype) * self.num_blocks

    # ------------------------------------------------------------------ the Drafter API

    def lag(self, seq: Sequence) -> int:
        return max(len(seq.token_ids) - 1 - self.computed.get(seq.request_id, 0), 0)

    def catch_up(self, seqs: list[Sequence]) -> CatchUp:
        out, jobs = CatchUp(), []
        for seq in seqs:
            c, target = self._start(seq, len(seq.token_ids) - 1), len(seq.token_ids) - 1
            if c < target:
                jobs.append(_Job(seq.request_id, seq.token_ids[c:target], c, 0))
                out.add(target - c, len(seq.token_ids))
        self._feed(jobs)
        return out

    def propose(self, seqs: list[Sequence], ks: list[int]) -> Proposal:
        drafts = ChainDrafts(seqs, ks)
        live = [i for i, k in enumerate(ks) if k > 0]
        feeds = {}
        for i in live:
            c = self._start(seqs[i], len(seqs[i].token_ids) - 1)
            feeds[i] = (seqs[i].token_ids[c:], c)
        while live:
            rows = self._feed([_Job(seqs[i].request_id, *feeds[i], 1) for i in live])
            ok = [(i, r) for i, r in zip(live, rows, strict=True) if r is not None]
            if not ok:
                break
            idx = [i for i, _ in ok]
            picked, q = self._pick(
                [seqs[i] for i in idx], torch.cat([r for _, r in ok]), drafts.positions(idx)
            )
            live = []
            for i, tok, qi in zip(idx, picked, q, strict=True):
                if drafts.add(i, tok, qi):
                    live.append(i)
                    feeds[i] = ([tok], self.computed[seqs[i].request_id])
        return drafts.proposal()

    def rollback(self, seq_id: str, num_tokens: int) -> None:
        if self.computed.get(seq_id, 0) > num_tokens:
            self.computed[seq_id] = num_tokens
            self.blocks.truncate(seq_id, num_tokens)

    def score(self, seqs: list[Sequence], starts: list[int]) -> Scores:
        jobs = []
        for seq, s in zip(seqs, starts, strict=True):
            end = len(seq.token_ids) - 1
            c = self._start(seq, s - 1)
            jobs.append(_Job(seq.request_id, seq.token_ids[c:end], c, end + 1 - s))
        rows = self._feed(jobs)
        tokens, logits = [], []
        for seq, s, r in zip(seqs, starts, rows, strict=True):
            if r is None:
                tokens.append([-1] * (len(seq.token_ids) - s))
            else:
                tokens.append(r.argmax(-1).tolist())
            logits.append(r)
        return Scores(tokens, logits)

    def score_prompt(self, seqs: list[Sequence], starts: list[int]) -> Scores:
        """The prompt prior from at most ``PROMPT_CONTEXT`` tokens before the scored positions,
        in a scratch entry dropped after. ``score`` would catch the drafter up on the whole
        prompt (over 200 tokens: 4 ms on nj-target's drafters, for each drafter and request,
        and most requests never draft with most drafters); the drafter a sequence takes
        catches up when it first drafts, and the cost rule charges that catch-up to the switch
        (``Drafter.lag``). Where the catch-up is no longer than the window (a short prompt, or
        a sequence the drafter already holds), the sequence is scored in place and kept."""
        out = Scores([[] for _ in seqs], [None for _ in seqs])
        near: list[int] = []
        far: list[int] = []
        for i, (q, s) in enumerate(zip(seqs, starts, strict=True)):
            (near if self._behind(q, s) <= PROMPT_CONTEXT else far).append(i)
        if near:
            scores = self.score([seqs[i] for i in near], [starts[i] for i in near])
            for j, i in enumerate(near):
                out.tokens[i], out.logits[i] = scores.tokens[j], scores.logits[j]
        jobs = [
            _Job(
                f"{SCRATCH}{i}",
                seqs[i].token_ids[starts[i] - 1 - PROMPT_CONTEXT : -1],
                0,
                len(seqs[i].token_ids) - starts[i],
            )
            for i in far
        ]
        try:
            rows = self._feed(jobs)
        finally:
            for job in jobs:
                self.free(job.seq_id)
        for i, r in zip(far, rows, strict=True):
            out.tokens[i] = (
                [-1] * (len(seqs[i].token_ids) - starts[i]) if r is None else r.argmax(-1).tolist()
            )
            out.logits[i] = r
        return out

    def free(self, seq_id: str) -> None:
        self.computed.pop(seq_id, None)
        self.blocks.free(seq_id)

    def reset(self) -> None:
        self.computed.clear()
        self.blocks = BlockManager(self.num_blocks, self.runner.block_size, enable_prefix_caching=False)

    # ----------------------------------------------------------- KV pool (elastic memory)

    def release_kv(self) -> None:
        """Drop every sequence's state and the KV pool's memory."""
        self.reset()
        self.runner.cache.resize(0, [])

    def restore_kv(self) -> None:
        self.runner.cache.resize(self.num_blocks, [])
        self.reset()

    # ------------------------------------------------------------------ internals

    def _behind(self, seq: Sequence, start: int) -> int:
        """Tokens ``score`` would feed ahead of position ``start − 1`` to score from ``start``."""
        return max(start - 1 - self.computed.get(seq.request_id, 0), 0)

    def _start(self, seq: Sequence, most: int) -> int:
        """Tokens of ``seq`` already in the cache, rolled back to at most ``most``."""
        self.rollback(seq.request_id, most)
        return self.computed.get(seq.request_id, 0)

    def _feed(self, jobs: list[_Job]) -> list[torch.Tensor | None]:
        """Compute every job's tokens, chunked into forwards of at most ``max_batched_tokens``
        (one chunk per sequence per forward, in order). Returns each job's wanted rows; None
        for a job the pool had no room for (its state is dropped, it starts over later)."""
        rows: list[list[torch.Tensor]] = [[] for _ in jobs]
        failed: set[int] = set()
        offset = [0] * len(jobs)
        pending = [j for j, job in enumerate(jobs) if job.tokens]
        while pending:
            budget, items, owners = self.max_batched_tokens, [], []
            for j in pending:
                job = jobs[j]
                n = min(len(job.tokens) - offset[j], budget)
                if n <= 0:
                    break
                a, end = job.start + offset[j], job.start + len(job.tokens)
                if not self.blocks.allocate(job.seq_id, a, a + n):
                    failed.add(j)
                    continue
                want = max(0, a + n - max(a, end - job.num_logits))
                items.append(
                    ForwardItem(job.tokens[offset[j] : offset[j] + n], a, self.blocks.table(job.seq_id), want)
                )
                owners.append(j)
                offset[j] += n
                budget -= n
            if items:
                logits, first = self.runner.run(items)
                for item, j, f in zip(items, owners, first, strict=True):
                    if item.num_logits:
                        rows[j].append(logits[f : f + item.num_logits])
            pending = [j for j in pending if j not in failed and offset[j] < len(jobs[j].tokens)]
        out: list[torch.Tensor | None] = []
        for j, job in enumerate(jobs):
            if j in failed:
                self.free(job.seq_id)
                out.append(None)
                continue
            self.computed[job.seq_id] = job.start + len(job.tokens)
            out.append(torch.cat(rows[j]) if len(rows[j]) > 1 else rows[j][0] if rows[j] else None)
        return out

    def _pick(
        self, seqs: list[Sequence], logits: torch.Tensor, positions: list[int]
    ) -> tuple[list[int], list[torch.Tensor | None]]:
        """One draft per row (at output position ``positions[i]``): argmax (greedy), or a draw
        from the warped distribution (see the module docstring)."""
        tokens = logits.argmax(-1).tolist()
        return _draws(seqs, logits, positions, tokens)


def _draws(
    seqs: list[Sequence], logits: torch.Tensor, positions: list[int], tokens: list[int]
) -> tuple[list[int], list[torch.Tensor | None]]:
    """``tokens`` (the greedy picks) with every sampled row's draw in its place, and q for
    every sampled row. ``logits`` span the full vocabulary."""
    q: list[torch.Tensor | None] = [None] * len(seqs)
    sampled = [i for i, s in enumerate(seqs) if not s.params.greedy]
    if sampled:
        probs = filtered_probs(logits[sampled], [seqs[i].params for i in sampled]).cpu()
        picked = draw(
            probs,
            [seqs[i].params for i in sampled],
            [positions[i] for i in sampled],
            [seqs[i].generator for i in sampled],
        )
        for row, (i, tok) in enumerate(zip(sampled, picked, strict=True)):
            tokens[i] = tok
            q[i] = probs[row]
    return tokens, q
