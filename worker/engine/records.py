"""The named records one engine step passes from phase to phase.

schedule → ``Scheduled`` (scheduler.py) → draft → ``DraftRound`` (a ``Drafted`` per
decoding sequence; the sequences do not hold their drafts) → forward → ``Candidate`` per
sequence whose forward produced logits rows, and ``PromptRows`` to score (forward.py) →
verify → ``Verified`` (the tokens the target chose) → commit (commit.py: the tokens that
stand, into the sequences and caches); ``StepWork`` sums up those phases for the step's stats
(step_stats.py). Each phase takes the records of the one before and returns its own; none
fills in an argument.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from shared.control import SwitchCostEvent
from worker.engine.api import DraftOutcome
from worker.engine.scheduler import Scheduled
from worker.engine.sequence import Sequence


@dataclass
class Drafted:
    """One decoding sequence's drafts of this step (fed after its tokens, not among them)."""

    start: int  # the sequence's tokens (L): the first emitted token lands at position L
    tokens: list[int]
    q: torch.Tensor | None  # [len(tokens), V] draft probabilities (sampled sequences; None: point mass)
    requested: int  # γ reserved for it
    drafter: str = ""  # the drafter that drafted them


@dataclass
class DraftRound:
    """What drafting did this step."""

    drafts: dict[str, Drafted] = field(default_factory=dict)  # request id -> its drafts
    drafter: str | None = None  # the drafter of the most sequences (None: nothing was drafted)
    shares: dict[str, int] = field(default_factory=dict)  # drafter -> sequences it drafted for
    switch_costs: list[SwitchCostEvent] = field(default_factory=list)  # catch-ups that had work
    seconds: float = 0.0  # the proposal forwards

    @property
    def proposed(self) -> int:
        return sum(len(d.tokens) for d in self.drafts.values())


@dataclass
class PromptRows:
    """Logits rows of a prompt chunk, positions ``start ..``, each scoring the next prompt
    token (a request that asks for prompt logprobs; commit records them)."""

    seq: Sequence
    start: int
    rows: torch.Tensor


@dataclass
class Candidate:
    """A scheduled sequence that gets tokens this step: its target logits rows ([k+1, V],
    k = its drafts; 1 row for a plain decode or a prompt's end) and their argmax."""

    scheduled: Scheduled
    logits: torch.Tensor
    argmax: list[int]
    drafted: Drafted | None = None
    from_cache: bool = False  # an exact prompt repeat: the rows are the stored logits

    @property
    def seq(self) -> Sequence:
        return self.scheduled.seq


@dataclass
class Verified:
    """The target's choice for one candidate."""

    candidate: Candidate
    emitted: list[int]  # accepted drafts + the target's own token (1..k+1), before any EOS cut
    p: torch.Tensor | None  # warped target probabilities at those positions (sampled sequences)

    @property
    def seq(self) -> Sequence:
        return self.candidate.seq

    @property
    def drafted(self) -> Drafted | None:
        return self.candidate.drafted

    def outcome(self, kept: int) -> DraftOutcome:
        """The step for this sequence when its first ``kept`` emitted tokens stand: every
        emitted token but the last is an accepted draft, the last is the target's own."""
        d = self.drafted
        if d is None:
            return DraftOutcome(tokens=kept)
        accepted = min(len(self.emitted) - 1, kept)
        return DraftOutcome(kept, accepted, len(d.tokens), d.requested, d.drafter or None)


@dataclass
class StepWork:
    """What draft → forward → verify → commit did this step (all zero after a failure)."""

    drafted: DraftRound = field(default_factory=DraftRound)
    verified: list[Verified] = field(default_factory=list)
    kept: int = 0  # tokens emitted
    prefilled: int = 0  # prompt tokens computed
    verify_time: float = 0.0  # the target forward, verification and commit
    failed: list[Sequence] = field(default_factory=list)  # finished with an engine error
