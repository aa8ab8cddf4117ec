"""What a drafter is to the engine: propose, catch up, score, roll back, forget.

A drafter sees the engine's ``Sequence`` objects (request id, token ids, sampling params and
generator) and keeps whatever per-sequence state it needs under the request id. Every call
is batched over the sequences of one step. Positions follow the target: a decoding sequence
of ``L`` tokens has its first ``L − 1`` in the target's cache and its last one uncomputed.

- ``catch_up``: bring the drafter's state up to the first ``L − 1`` tokens (what it missed
  while speculation was off); the engine times this as the switching cost.
- ``propose``: up to ``k`` draft tokens per sequence after all ``L`` tokens, with the
  (warped) probabilities they were drawn from for sampled sequences (a seeded one's draws are
  keyed on its seed and each draft's output position: worker/engine/keyed.py).
- ``rollback``: only the first ``n`` tokens are still the sequence's (rejected drafts dropped).
- ``score``: the counterfactual — what the drafter would have proposed first at each of the
  positions just verified (HedgeSpec's full-information feedback); also keeps it current.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch

from worker.engine.sequence import Sequence


@dataclass
class Proposal:
    tokens: list[list[int]]  # per sequence, at most its k drafts
    # Per sequence: [len(tokens[i]), V] probabilities the drafts were sampled from (sampled
    # sequences only — a seeded one's keyed draw is from them too; None for greedy ones and
    # point-mass proposals, whose verification needs no q).
    probs: list[torch.Tensor | None] = field(default_factory=list)


@dataclass
class Scores:
    """Per sequence, the drafter's view of positions ``start .. len − 1``."""

    tokens: list[list[int]]  # its first proposal (argmax / lookup; -1: none) at each position
    logits: list[torch.Tensor | None]  # model drafters: the raw rows, for 1 − TV when sampling


@dataclass
class CatchUp:
    batch_size: int = 0  # sequences that had something to catch up
    tokens: int = 0  # largest number of tokens one sequence caught up
    input_len: int = 0  # longest context among them

    def add(self, tokens: int, input_len: int) -> None:
        """Count one sequence that catches up ``tokens`` tokens of its ``input_len``."""
        self.batch_size += 1
        self.tokens = max(self.tokens, tokens)
        self.input_len = max(self.input_len, input_len)


class ChainDrafts:
    """A chain drafter's drafts as it draws them, one position per round, for ``propose``:
    sequence ``i`` wants at most ``ks[i]``."""

    def __init__(self, seqs: list[Sequence], ks: list[int]) -> None:
        self.seqs, self.ks = seqs, ks
        self.tokens: list[list[int]] = [[] for _ in seqs]
        self.probs: list[list[torch.Tensor]] = [[] for _ in seqs]

    def positions(self, live: list[int]) -> list[int]:
        """The output position of each live sequence's next draft (what keys a seeded draw)."""
        return [self.seqs[i].position(len(self.seqs[i].token_ids) + len(self.tokens[i])) for i in live]

    def add(self, i: int, token: int, q: torch.Tensor | None) -> bool:
        """Sequence ``i``'s next draft and the probabilities it was drawn from (None: greedy);
        whether it wants another."""
        self.tokens[i].append(token)
        if q is not None:
            self.probs[i].append(q)
        return len(self.tokens[i]) < self.ks[i]

    def proposal(self) -> Proposal:
        return Proposal(self.tokens, [torch.stack(p) if p else None for p in self.probs])


class Drafter(ABC):
    """A source of draft tokens for a batch of sequences."""

    name: str = ""

    @property
    def weight_bytes(self) -> int:
        """Device bytes of weights (0 without weights)."""
        return 0

    @property
    def kv_bytes(self) -> int:
        """Device bytes of its own KV pool (0 without one)."""
        return 0

    def lag(self, seq: Sequence) -> int:
        """Tokens of ``seq`` this drafter would catch up on before drafting for it (0: none;
        a drafter that keeps no state per sequence never lags)."""
        return 0

    @abstractmethod
    def catch_up(self, seqs: list[Sequence]) -> CatchUp:
        """Process every sequence's tokens up to (not including) its last one."""

    @abstractmethod
    def propose(self, seqs: list[Sequence], ks: list[int]) -> Proposal:
        """At most ``ks[i]`` drafts after all of ``seqs[i].token_ids``."""

    @abstractmethod
    def rollback(self, seq_id: str, num_tokens: int) -> None:
        """Forget anything past the sequence's first ``num_tokens`` tokens."""

    @abstractmethod
    def score(self, seqs: list[Sequence], starts: list[int]) -> Scores:
        """Predictions for the tokens at positions ``starts[i] .. len − 1`` of each sequence."""

    def score_prompt(self, seqs: list[Sequence], starts: list[int]) -> Scores:
        """``score`` for sequences about to draft for the first time (the prompt prior,
        plan.py): predictions for positions ``starts[i] ..`` from what the prompt says there.
        By default ``score`` itself; a drafter whose ``score`` would catch it up on the whole
        prompt may read less of it (ModelDrafter)."""
        return self.score(seqs, starts)

    @abstractmethod
    def free(self, seq_id: str) -> None:
        """Drop the sequence's state (finished, aborted or preempted)."""

    @abstractmethod
    def reset(self) -> None:
        """Drop every sequence's state."""
