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
from dataclasses import dataclass

import torch

from shared.schemas import Decision
from worker.engine.api import StepStats
from worker.engine.scheduler import Scheduled
from worker.engine.sequence import Sequence
from worker.engine.spec.drafter import Drafter
from worker.engine.spec.memory import ElasticMemory
from worker.engine.spec.pool import DrafterPool


@dataclass
class Drafted:
    """One decoding sequence's drafts of this step."""

    start: int  # tokens before the drafts (L): the first emitted token lands at position L
    tokens: list[int]
    q: torch.Tensor | None  # [len(tokens), V] draft probabilities (sampled sequences; None: point mass)
    requested: int  # γ reserved for it


@dataclass
class Verified:
    seq: Sequence
    drafted: Drafted
    emitted: int  # tokens verification produced (accepted drafts + 1)
    p: torch.Tensor | None  # warped target probabilities at the emitted positions (sampled)


class Speculator:
    def __init__(self, pool: DrafterPool | None, memory: ElasticMemory, max_gamma: int) -> None:
        self.pool, self.memory, self.max_gamma = pool, memory, max_gamma

    def choose(self, decision: Decision | None, batch: int) -> tuple[int, Drafter | None]:
        if self.pool is None or decision is None or batch == 0 or not self.memory.resident:
            return 0, None
        gamma = max(0, min(decision.gamma_for(batch), self.max_gamma))
        return (gamma, self.pool.resolve(decision.drafter)) if gamma else (0, None)

    def draft(
        self, drafter: Drafter | None, scheduled: list[Scheduled], stats: StepStats
    ) -> dict[str, Drafted]:
        """Drafts for every decoding sequence (appended to its tokens, counted in num_new)."""
        decoding = [s for s in scheduled if not s.seq.prefilling and s.num_new > 0]
        if self.pool is None or not decoding:
            return {}
        if drafter is None:
            self.pool.last_active = None  # γ = 0 ran: every drafter falls behind
            return {}
        seqs = [s.seq for s in decoding]
        event = self.pool.catch_up(drafter, seqs)
        if event is not None:
            stats.switch_costs.append(event)
        t0 = time.perf_counter()
        proposal = drafter.propose(seqs, [s.num_lookahead for s in decoding])
        out = {}
        for s, tokens, q in zip(decoding, proposal.tokens, proposal.probs, strict=True):
            out[s.seq.request_id] = Drafted(len(s.seq.token_ids), tokens, q, s.num_lookahead)
            s.seq.token_ids.extend(tokens)
            s.num_new += len(tokens)
        self.pool.last_active = drafter.name
        stats.draft_time = time.perf_counter() - t0
        stats.drafter = drafter.name
        stats.proposed = sum(len(d.tokens) for d in out.values())
        return out

    def rollback(self, seq_id: str, num_tokens: int) -> None:
        if self.pool is not None:
            self.pool.rollback(seq_id, num_tokens)

    def free(self, seq_id: str) -> None:
        if self.pool is not None:
            self.pool.free(seq_id)

    def feedback(self, drafter: Drafter, verified: list[Verified], stats: StepStats) -> None:
        """Realised acceptance of ``drafter`` and, when due, every other drafter's
        counterfactual acceptance on the same verified tokens."""
        if self.pool is None or not verified:
            return
        accepted = judged = 0
        for v in verified:
            k = len(v.drafted.tokens)
            accepted += v.emitted - 1
            # Drafts judged: up to and including the first rejected one; a sequence that asked
            # for drafts and got none counts one miss, as the counterfactual would.
            judged += min(v.emitted, k) if k else int(v.drafted.requested > 0)
        stats.accepted = accepted
        rates = {drafter.name: accepted / judged} if judged else {}
        if self.pool.due():
            t0 = time.perf_counter()
            rates |= self.pool.counterfactual(
                drafter,
                [v.seq for v in verified],
                [v.drafted.start for v in verified],
                [v.p for v in verified],
            )
            stats.counterfactual_time = time.perf_counter() - t0
        stats.counterfactual = rates
