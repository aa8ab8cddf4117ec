"""The named records one engine step passes from phase to phase.

schedule → ``Scheduled`` (scheduler.py) → draft → ``Drafted`` per decoding sequence → run →
``Candidate`` per sequence whose forward produced logits rows → verify → ``Verified`` (the
tokens the target chose) → postprocess. Each phase takes the records of the one before and
returns its own; none fills in an argument.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from worker.engine.scheduler import Scheduled
from worker.engine.sequence import Sequence


@dataclass
class Drafted:
    """One decoding sequence's drafts of this step (already appended to its tokens)."""

    start: int  # tokens before the drafts (L): the first emitted token lands at position L
    tokens: list[int]
    q: torch.Tensor | None  # [len(tokens), V] draft probabilities (sampled sequences; None: point mass)
    requested: int  # γ reserved for it


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
