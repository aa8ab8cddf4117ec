"""A feature drafter (EAGLE-style): one decoder layer over the target's own last hidden states.

Entry ``p`` of a sequence in the drafter's paged KV reads ``fc([f_p; embed(x_{p+1})])``: the
target's post-norm last-layer feature at position ``p`` and the embedding of the token after
it. The layer's normed output ``h`` stands for ``f_{p+1}``; the target's tied LM head rows of
the drafter's vocabulary (``vocab_ids``, a reduced frequency-ranked vocabulary) turn it into the
distribution of ``x_{p+2}``. Chain drafting feeds ``(h, draft)`` as the next entry: one batched
forward per draft position, the first one also feeding every real entry not yet in the cache.

Features arrive from the target's forwards through ``observe`` (the engine hands them only while
a feature drafter is resident) and wait per sequence until the tokens after them are known;
entries made from real features are kept, drafted ones are overwritten by the real ones at the
next call. Pending features are bounded (``max_pending`` rows a sequence; past it only the newest
half stays and the drafter's context restarts there) and freed with the sequence. The bound is
also the most a catch-up computes per sequence: features pile up only while the drafter does
not draft (γ = 0, another drafter drafting, a prompt prefilled), and a policy exploring one
speculative step after a long γ = 0 stretch would otherwise pay a forward over every position
of every sequence, prompts included. On SmolLM2's heads 64 rows keep the acceptance (0.273
against 0.277 with 4096, ShareGPT at γ = 2, benchmarks/nothing_pays.py) and cut the drafters'
work to 40 % when speculation stays on (a new sequence's prompt). Positions
the target never computed (a prefix-cache hit, an exact repeat, the time the drafter was
offloaded) have no features: the drafter's context then starts at the first feature it got
(``base``), which costs acceptance, never exactness.
The head itself (weights, forward, loading) is ``worker/engine/spec/feature_model.py``.
"""

from __future__ import annotations

import torch

from worker.engine.sequence import Sequence
from worker.engine.spec.drafter import CatchUp, ChainDrafts, Proposal, Scores
from worker.engine.spec.feature_model import FeatureModel, FeatureRunner
from worker.engine.spec.model_drafter import ModelDrafter, _draws, _Job

MAX_PENDING = 64  # feature rows one sequence may hold (a catch-up's most) before the oldest go


class _Pending:
    """Real features of positions ``start ..`` that the drafter's cache does not hold yet.

    Rows arrive a few at a time (a decode step's one row per sequence): they are kept as a list
    of chunks and joined only when read, so a step that only observes appends in O(1) instead
    of copying every row held so far (the rows are the forward's own tensors, not copies: every
    feature drafter of the pool holds the same ones, and none writes to them)."""

    def __init__(self, start: int, rows: torch.Tensor) -> None:
        self.start = start
        self._chunks = [rows]
        self.size = int(rows.shape[0])

    @property
    def rows(self) -> torch.Tensor:
        if len(self._chunks) > 1:
            self._chunks = [torch.cat(self._chunks)]
        return self._chunks[0]

    @rows.setter
    def rows(self, value: torch.Tensor) -> None:
        self._chunks, self.size = [value], int(value.shape[0])

    def append(self, rows: torch.Tensor) -> None:
        self._chunks.append(rows)
        self.size += int(rows.shape[0])

    @property
    def end(self) -> int:
        return self.start + self.size


class FeatureDrafter(ModelDrafter):
    """``computed`` (ModelDrafter's) counts entries in the cache; ``real`` those made from the
    target's features (drafted entries after them are dropped at the next call); local entry
    ``j`` is target position ``base + j``."""

    runner: FeatureRunner

    def __init__(
        self, name: str, runner: FeatureRunner, max_batched_tokens: int = 512, max_pending: int = MAX_PENDING
    ) -> None:
        super().__init__(name, runner, max_batched_tokens)
        self.model: FeatureModel = runner.model
        self.max_pending = max_pending
        self.base: dict[str, int] = {}
        self.real: dict[str, int] = {}
        self.pending: dict[str, _Pending] = {}
        vocab = self.model.vocab_ids
        self.vocab_size = int(runner.config.vocab_size)
        self.num_draft_tokens = int(vocab.numel())

    # ------------------------------------------------------------------ features in

    def observe(self, seq_id: str, start: int, rows: torch.Tensor) -> None:
        """The target computed positions ``start .. start + len(rows) − 1``: their features."""
        if rows.shape[0] == 0:
            return
        rows = rows.detach()
        p = self.pending.get(seq_id)
        expected = p.end if p is not None else self._next_entry(seq_id)
        if seq_id not in self.base:
            self.base[seq_id], self.real[seq_id] = start, 0
            p = None
        elif start > expected:  # a gap: no features in between; the context restarts here
            self.free(seq_id)
            self.base[seq_id], self.real[seq_id] = start, 0
            p = None
        elif p is not None and start < p.end:
            p.rows = p.rows[: max(0, start - p.start)]
        if p is None or p.size == 0:
            p = self.pending[seq_id] = _Pending(start, rows)
        else:
            p.append(rows)
        if p.size > self.max_pending:
            # Bounded: keep the newest half, restart the context there. The drafter falls this
            # far behind only while it does not draft (γ = 0, or another drafter drafts), so
            # this also bounds its catch-up at the next switch to max_pending entries.
            keep = max(1, self.max_pending // 2)
            p.start, p.rows = p.end - keep, p.rows[-keep:].clone()
            self.free_cache(seq_id)
            self.base[seq_id], self.real[seq_id] = p.start, 0

    def pending_rows(self, seq_id: str) -> int:
        p = self.pending.get(seq_id)
        return 0 if p is None else p.size

    # ------------------------------------------------------------------ the Drafter API

    def lag(self, seq: Sequence) -> int:
        return self.pending_rows(seq.request_id)

    def catch_up(self, seqs: list[Sequence]) -> CatchUp:
        out, jobs = CatchUp(), []
        for seq in seqs:
            n = self._entries(seq, len(seq.token_ids) - 3)
            if n:
                jobs.append(self._job(seq, n, 0))
                out.add(n, len(seq.token_ids))
        self._run_jobs(jobs)
        return out

    def propose(self, seqs: list[Sequence], ks: list[int]) -> Proposal:
        drafts = ChainDrafts(seqs, ks)
        live, jobs = [], []
        for i, (seq, k) in enumerate(zip(seqs, ks, strict=True)):
            n = self._entries(seq, len(seq.token_ids) - 2) if k > 0 else 0
            if n:
                live.append(i)
                jobs.append(self._job(seq, n, 1))
        rows = self._run_jobs(jobs)
        while live:
            ok = [(i, r) for i, r in zip(live, rows, strict=True) if r is not None]
            if not ok:
                break
            k_dim = self.num_draft_tokens
            idx = [i for i, _ in ok]
            picked, q = self._pick_rows(
                [seqs[i] for i in idx], torch.cat([r[:, :k_dim] for _, r in ok]), drafts.positions(idx)
            )
            live, jobs = [], []
            for (i, r), tok, qi in zip(ok, picked, q, strict=True):
                if drafts.add(i, tok, qi):
                    live.append(i)
                    sid = seqs[i].request_id
                    jobs.append(_DraftJob(sid, self.computed[sid], r[:, k_dim:], tok))
            rows = self._run_jobs(jobs) if jobs else []
        return drafts.proposal()

    def rollback(self, seq_id: str, num_tokens: int) -> None:
        """Only the first ``num_tokens`` tokens stand: entries need ``x_{p+1}`` among them, and
        pending features ``f_p`` need ``p < num_tokens``."""
        if seq_id not in self.base:
            return
        p = self.pending.get(seq_id)
        if p is not None and p.end > num_tokens:
            p.rows = p.rows[: max(0, num_tokens - p.start)]
        if self.real[seq_id] > max(0, num_tokens - 1 - self.base[seq_id]):
            self.free(seq_id)  # real entries built on tokens that left (not in a normal step)

    def score(self, seqs: list[Sequence], starts: list[int]) -> Scores:
        jobs, wants = [], []
        for seq, s in zip(seqs, starts, strict=True):
            n = self._entries(seq, len(seq.token_ids) - 3)
            first = self._next_entry(seq.request_id)
            # Position j's prediction comes from entry j − 2: entries s − 2 .. len − 3.
            want = len(seq.token_ids) - s if n and first <= s - 2 and n >= len(seq.token_ids) - s else 0
            wants.append(want)
            jobs.append(self._job(seq, n, want) if n else None)
        rows = self._run_jobs([j for j in jobs if j is not None])
        it = iter(rows)
        tokens: list[list[int]] = []
        logits: list[torch.Tensor | None] = []
        for seq, s, job, want in zip(seqs, starts, jobs, wants, strict=True):
            r = next(it) if job is not None else None
            if r is None or want == 0:
                tokens.append([-1] * (len(seq.token_ids) - s))
                logits.append(None)
                continue
            lg = r[:, : self.num_draft_tokens]
            tokens.append(self.model.vocab_ids[lg.argmax(-1)].tolist())
            logits.append(None if seq.params.greedy else self._full(lg))
        return Scores(tokens, logits)

    def score_prompt(self, seqs: list[Sequence], starts: list[int]) -> Scores:
        """``score`` in place: a head reads the target's features of the prompt, handed over
        at prefill, and restarts its context where it skips a stretch (no scratch window)."""
        return self.score(seqs, starts)

    def free(self, seq_id: str) -> None:
        self.free_cache(seq_id)
        self._forget(seq_id)

    def reset(self) -> None:
        super().reset()
        self.base.clear()
        self.real.clear()
        self.pending.clear()

    # ------------------------------------------------------------------ internals

    def free_cache(self, seq_id: str) -> None:
        self.computed.pop(seq_id, None)
        self.blocks.free(seq_id)
        if seq_id in self.real:
            self.real[seq_id] = 0

    def _forget(self, seq_id: str) -> None:
        self.base.pop(seq_id, None)
        self.real.pop(seq_id, None)
        self.pending.pop(seq_id, None)

    def _next_entry(self, seq_id: str) -> int:
        return self.base.get(seq_id, 0) + self.real.get(seq_id, 0)

    def _entries(self, seq: Sequence, last: int) -> int:
        """Drop drafted entries; the number of real entries computable up to target position
        ``last`` (an entry ``p`` needs ``f_p`` pending and ``x_{p+1}`` in the sequence)."""
        sid = seq.request_id
        if sid not in self.base:
            return 0
        real = self.real[sid]
        if self.computed.get(sid, 0) > real:
            self.blocks.truncate(sid, real)
            self.computed[sid] = real
        p = self.pending.get(sid)
        first = self.base[sid] + real
        if p is None or p.start > first or p.end <= first:
            return 0
        return max(0, min(last, p.end - 1, len(seq.token_ids) - 2) - first + 1)

    def _job(self, seq: Sequence, n: int, num_logits: int) -> _RealJob:
        sid = seq.request_id
        p = self.pending[sid]
        first = self.base[sid] + self.real[sid]
        feats = p.rows[first - p.start : first - p.start + n]
        toks = seq.token_ids[first + 1 : first + 1 + n]
        return _RealJob(sid, self.real[sid], feats, toks, num_logits, n)

    def _run_jobs(self, jobs: list[_RealJob] | list[_DraftJob]) -> list[torch.Tensor | None]:
        """Bind every job's rows as one table and feed them through ``ModelDrafter._feed``
        (which frees a sequence the pool has no room for: it starts over at its next features)."""
        if not jobs:
            return []
        feats, toks, feed = [], [], []
        at = 0
        for job in jobs:
            feats.append(job.feats)
            toks += job.tokens
            n = len(job.tokens)
            feed.append(_Job(job.seq_id, list(range(at, at + n)), job.start, job.num_logits))
            at += n
        dev = self.model.device
        self.model.bind(torch.cat(feats).to(dev), torch.tensor(toks, dtype=torch.long, device=dev))
        rows = self._feed(feed)
        for job in jobs:
            if job.seq_id in self.base and job.consumed:
                self.real[job.seq_id] += job.consumed
                p = self.pending[job.seq_id]
                cut = self.base[job.seq_id] + self.real[job.seq_id] - p.start
                p.start, p.rows = p.start + cut, p.rows[cut:]
        return rows

    def _full(self, logits: torch.Tensor) -> torch.Tensor:
        """Rows over the drafter's vocabulary as full-vocabulary logits (−inf elsewhere)."""
        full = torch.full((logits.shape[0], self.vocab_size), float("-inf"), device=logits.device)
        full[:, self.model.vocab_ids] = logits.float()
        return full

    def _pick_rows(
        self, seqs: list[Sequence], logits: torch.Tensor, positions: list[int]
    ) -> tuple[list[int], list[torch.Tensor | None]]:
        """Argmax for greedy sequences; for sampled ones a draw (keyed for seeded ones, as the
        model drafter's: model_drafter.py) from the warped distribution renormalised over the
        drafter's vocabulary (q, for unseeded ones, is over the full vocabulary)."""
        tokens = self.model.vocab_ids[logits.argmax(-1)].tolist()
        if all(s.params.greedy for s in seqs):
            return tokens, [None] * len(seqs)
        return _draws(seqs, self._full(logits), positions, tokens)


class _RealJob:
    """Entries from real features: local positions ``start ..``."""

    def __init__(
        self, seq_id: str, start: int, feats: torch.Tensor, tokens: list[int], num_logits: int, consumed: int
    ) -> None:
        self.seq_id, self.start, self.feats, self.tokens = seq_id, start, feats, tokens
        self.num_logits, self.consumed = num_logits, consumed


class _DraftJob(_RealJob):
    """One drafted entry: the drafter's own output feature and its draft token."""

    def __init__(self, seq_id: str, start: int, feat: torch.Tensor, token: int) -> None:
        super().__init__(seq_id, start, feat, [token], 1, 0)
