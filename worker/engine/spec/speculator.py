"""The engine's speculation, step by step: γ and drafter, drafting, rollback, feedback.

Per step the engine asks ``choose`` for γ (the planner's ``Decision.gamma_for`` at the batch
size of decoding sequences, capped at ``max_gamma``; 0 without a decision, without drafters,
or while the draft is not resident) and the drafter, reserves γ slots per decoding sequence
in the scheduler, then ``draft`` appends each sequence's drafts to its tokens. After the one
target forward and verification, ``rollback`` drops rejected drafts from every drafter and
``feedback`` computes the acceptance of the active drafter (realised) and of every other one
(counterfactual) for telemetry.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from shared.schemas import Decision
from worker.engine.records import Drafted, DraftRound, Verified
from worker.engine.scheduler import Scheduled
from worker.engine.spec.drafter import Drafter
from worker.engine.spec.memory import ElasticMemory
from worker.engine.spec.pool import DrafterPool


@dataclass
class Feedback:
    """Acceptance of the step's drafts, realised and counterfactual."""

    accepted: int = 0
    counterfactual: dict[str, float] = field(default_factory=dict)  # drafter -> acceptance rate
    seconds: float = 0.0  # counterfactual scoring
    drafts: int = 0  # sequences whose drafts were verified
    per_pos: list[int] = field(default_factory=list)  # accepted drafts at each draft position


class Speculator:
    def __init__(self, pool: DrafterPool | None, memory: ElasticMemory, max_gamma: int) -> None:
        self.pool, self.memory, self.max_gamma = pool, memory, max_gamma

    def choose(self, decision: Decision | None, batch: int) -> tuple[int, Drafter | None]:
        if self.pool is None or decision is None or batch == 0 or not self.memory.resident:
            return 0, None
        gamma = max(0, min(decision.gamma_for(batch), self.max_gamma))
        return (gamma, self.pool.resolve(decision.drafter)) if gamma else (0, None)

    def draft(self, drafter: Drafter | None, scheduled: list[Scheduled]) -> DraftRound:
        """Drafts for every decoding sequence (appended to its tokens, counted in num_new)."""
        decoding = [s for s in scheduled if not s.prefill]
        if self.pool is None or not decoding:
            return DraftRound()
        if drafter is None:
            self.pool.last_active = None  # γ = 0 ran: every drafter falls behind
            return DraftRound()
        seqs = [s.seq for s in decoding]
        switch_cost = self.pool.catch_up(drafter, seqs)
        t0 = time.perf_counter()
        proposal = drafter.propose(seqs, [s.num_lookahead for s in decoding])
        drafts = {}
        for s, tokens, q in zip(decoding, proposal.tokens, proposal.probs, strict=True):
            drafts[s.seq.request_id] = Drafted(len(s.seq.token_ids), tokens, q, s.num_lookahead)
            s.seq.token_ids.extend(tokens)
            s.num_new += len(tokens)
        self.pool.last_active = drafter.name
        return DraftRound(drafts, drafter.name, switch_cost, time.perf_counter() - t0)

    def wants_features(self) -> bool:
        """Whether this step's target forward hands over its last hidden states: only while
        a feature drafter is in the pool and resident (at γ = 0 too: catch-up reads them)."""
        return self.pool is not None and bool(self.pool.features) and self.memory.resident

    def observe(self, seq_id: str, start: int, rows: torch.Tensor) -> None:
        """The target's features of positions ``start ..`` of a sequence, for feature drafters."""
        assert self.pool is not None
        for d in self.pool.features:
            d.observe(seq_id, start, rows)

    def rollback(self, seq_id: str, num_tokens: int) -> None:
        if self.pool is not None:
            self.pool.rollback(seq_id, num_tokens)

    def free(self, seq_id: str) -> None:
        if self.pool is not None:
            self.pool.free(seq_id)

    def reset(self) -> None:
        """Drop every drafter's per-sequence state (each catches up at its next draft)."""
        if self.pool is not None:
            self.pool.reset()

    def feedback(self, drafter: Drafter | None, verified: list[Verified]) -> Feedback:
        """Realised acceptance of ``drafter`` and, when due, every other drafter's
        counterfactual acceptance on the same verified tokens."""
        drafted = [v for v in verified if v.drafted is not None]
        if self.pool is None or drafter is None or not drafted:
            return Feedback()
        accepted = judged = 0
        for v in drafted:
            assert v.drafted is not None
            k = len(v.drafted.tokens)
            accepted += len(v.emitted) - 1
            # Drafts judged: up to and including the first rejected one; a sequence that asked
            # for drafts and got none counts one miss, as the counterfactual would.
            judged += min(len(v.emitted), k) if k else int(v.drafted.requested > 0)
        rates = {drafter.name: accepted / judged} if judged else {}
        seconds = 0.0
        if self.pool.due():
            t0 = time.perf_counter()
            rates |= self.pool.counterfactual(
                drafter,
                [v.seq for v in drafted],
                [v.drafted.start for v in drafted if v.drafted is not None],
                [v.p for v in drafted],
            )
            seconds = time.perf_counter() - t0
        per_pos = [0] * max((len(v.drafted.tokens) for v in drafted if v.drafted is not None), default=0)
        for v in drafted:
            for pos in range(min(len(v.emitted) - 1, len(per_pos))):
                per_pos[pos] += 1
        return Feedback(accepted, rates, seconds, len(drafted), per_pos)
