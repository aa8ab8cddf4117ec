"""The cost rule's evidence besides a sequence's own verifications: its drafters scored on its
prompt before its first draft, and on its own output while it runs γ = 0.

**The prompt prior.** Before a sequence drafts, every drafter that could pay is scored
teacher-forced on the last ``PROMPT_POSITIONS`` tokens of its prompt (one drafter forward over
tokens already there: HedgeSpec's counterfactual, on the prompt), each position counted
``PROMPT_WEIGHT`` against one verified position. Prompt text is not the target's own, so the
prompt ranks the drafters and the planner sets the level (``PromptCentre``).

**γ = 0 scores.** A sequence that runs γ = 0 verifies nothing, so without these it would learn
nothing about the drafters it does not draft with: its acceptance stays where its prompt put
it, and the planner's prior where the last drafting left it (on SmolLM2's one-user chat the
chat head's prompt agreement is 0.17 and its acceptance on the answer 0.45: the requests
stayed on plain decoding). Every ``plain_score_every`` γ = 0 steps of a sequence (at least
``PLAIN_SCORE_EVERY``, and no more often than ``PLAIN_SCORE_SHARE`` of a plain step's time
pays for) the model drafters that could pay score its last tokens (at most
``PLAIN_SCORE_MAX``), into its counts and into the step's counterfactual, which the planner
learns its prior from. A scored drafter catches up on those tokens, as it would before its
next draft. Agreement is greedy (teacher-forced argmax), as the prompt's is.

A drafter that fails while scoring costs the drafters their state (they catch up again, the
caller's ``on_failure``), never a request: its sequences go on from what they knew.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Collection

from worker.engine.sequence import Sequence
from worker.engine.spec.model_drafter import ModelDrafter
from worker.engine.spec.plan import DEFAULT_ACCEPTANCE, PLAIN_SCORE_EVERY
from worker.engine.spec.pool import DrafterPool

log = logging.getLogger(__name__)

PROMPT_POSITIONS = 24  # last prompt tokens each drafter is scored on before a sequence drafts
PROMPT_WEIGHT = 0.25  # one teacher-forced prompt position against one verified position
PROMPT_MEAN_DISCOUNT = 0.9  # per prompt scored, on a drafter's running mean prompt acceptance
PLAIN_SCORE_SHARE = 0.02  # of a plain step's time, what the γ = 0 scores may cost on average
SCORE_TIME_WEIGHT = 0.2  # a new measurement's weight in the moving time of one γ = 0 score

Hits = list[dict[str, tuple[float, int]]]  # per sequence: drafter -> (accepted, judged)


def plain_score_every(sequences: int, score_s: float | None, plain_s: float) -> int:
    """Every how many γ = 0 steps each of ``sequences`` γ = 0 sequences is scored, for the
    scores to cost at most ``PLAIN_SCORE_SHARE`` of a plain step (``plain_s``) on average: one
    sequence's score costs ``score_s`` (measured; None: not yet, ``PLAIN_SCORE_EVERY``), and
    a step scores ``sequences / every`` of them. At least ``PLAIN_SCORE_EVERY``: on SmolLM2
    fp32 (a 36 ms plain step, both heads scoring 8 tokens) that is the bound; on nj-target
    (a 2 ms step) its model drafters' scores would cost several times the share at 8."""
    if score_s is None or plain_s <= 0:
        return PLAIN_SCORE_EVERY
    return max(PLAIN_SCORE_EVERY, math.ceil(sequences * score_s / (PLAIN_SCORE_SHARE * plain_s)))


class PromptCentre:
    """The prompt prior as a shift from the planner's: a prompt counts at the drafter's prior
    acceptance plus how far its teacher-forced acceptance lies from the recent prompts' (a
    running mean per drafter, discounted ``PROMPT_MEAN_DISCOUNT`` a prompt). Prompt text is
    not what the target will write: on SmolLM2's chat prompts the chat head agrees with 17 %
    of the last prompt tokens (the code head with 15 %), and its drafts of the answer are
    accepted at about 45 % a position (static γ 2), so counted as it measures, every chat
    request started below its prior for the head and drafted with n-gram or nothing (nightjar
    0.959 of static chat head γ 2 at one user). The prompt ranks: a code
    prompt above the recent prompts' mean for the code drafter starts above its prior; the
    level is the planner's, learned from drafts.

    Among the model drafters (``ranked``: two or more scored on a prompt) the shift is
    relative: each one's distance from the recent mean less their average distance, so a
    prompt every drafter finds easier than the last ones (code after chat: repeated names,
    fixed syntax) raises none of them over the others. Measured on SmolLM2 (greedy agreement,
    12 prompts each, 2026-12-07): the chat head agrees with 11 % of a chat prompt's last tokens
    and 59 % of its answer, with 26 % of a code prompt's and 42 % of its answer; the code head
    13 % → 35 % and 27 % → 48 %. Shifted one by one, a code request after a chat phase started
    the chat head 15 points above its chat-phase prior, where its acceptance is 17 points below
    it (nightjar 0.934 of static n-gram γ 4 on one-user code after chat, BENCHMARKS.md). A
    model-free drafter keeps its own shift: its agreement with the prompt is lookups of the
    prompt's own text, which an answer repeats (n-gram: 29 % → 47 % on chat, 31 % → 61 % on
    code)."""

    def __init__(self) -> None:
        self.mean: dict[str, list[float]] = {}  # drafter -> [accepted, judged], discounted

    def centred(self, hits: Hits, prior: dict[str, float], ranked: Collection[str] = ()) -> Hits:
        """Each sequence's (accepted, judged) per drafter with its acceptance moved to the
        prior plus its distance from the running mean (this batch's prompts in it first),
        relative among the ``ranked`` drafters."""
        for h in hits:
            for m in self.mean.values():
                m[0], m[1] = PROMPT_MEAN_DISCOUNT * m[0], PROMPT_MEAN_DISCOUNT * m[1]
            for name, (accepted, judged) in h.items():
                m = self.mean.setdefault(name, [0.0, 0.0])
                m[0], m[1] = m[0] + accepted, m[1] + judged
        out: Hits = []
        for h in hits:
            shifts = {n: a / j - self.mean[n][0] / self.mean[n][1] for n, (a, j) in h.items()}
            among = [shifts[n] for n in shifts if n in ranked]
            common = sum(among) / len(among) if len(among) > 1 else 0.0
            row = {}
            for name, (_, judged) in h.items():
                shift = shifts[name] - (common if name in ranked else 0.0)
                alpha = min(max(prior.get(name, DEFAULT_ACCEPTANCE) + shift, 0.0), 1.0)
                row[name] = (alpha * judged, judged)
            out.append(row)
        return out


class SequenceScores:
    """Scores the drafters on a sequence's prompt and, at γ = 0, on its own output."""

    def __init__(self, pool: DrafterPool, on_failure: Callable[[], None]) -> None:
        self.pool, self.on_failure = pool, on_failure
        self.centre = PromptCentre()  # the prompt prior's running means
        self.score_s: float | None = None  # one γ = 0 sequence's score, seconds (moving)

    def prompts(self, seqs: list[Sequence], names: list[str], prior: dict[str, float]) -> None:
        """The drafters ``names``' agreement with the last tokens of each new sequence's
        prompt (and its first output token), centred (``PromptCentre``), into the sequence's
        counts at ``PROMPT_WEIGHT`` (a drafter not scored starts from the planner's prior); the
        model drafters ranked against each other."""
        starts = [max(len(s.token_ids) - 1 - PROMPT_POSITIONS, 1) for s in seqs]
        hits = self._hits(seqs, starts, names, "their prompts")
        if hits is None:
            hits = [{} for _ in seqs]
        models = [n for n in names if isinstance(self.pool.drafters.get(n), ModelDrafter)]
        for seq, h in zip(seqs, self.centre.centred(hits, prior, models), strict=True):
            for name, (accepted, judged) in h.items():
                seq.spec.add(name, accepted, judged, PROMPT_WEIGHT)
            seq.spec.prompt_scored = True

    def plain(self, seqs: list[Sequence], names: list[str], plain_s: float) -> tuple[Hits, float] | None:
        """The model drafters ``names`` scored on the last tokens of ``seqs`` (the decoding
        sequences that ran γ = 0, at a plain step of ``plain_s``), each every
        ``plain_score_every`` such steps, into its counts; the hits and their seconds, for the
        step's counterfactual (None: nothing scored)."""
        every = plain_score_every(len(seqs), self.score_s, plain_s)
        due = [(s, n) for s in seqs if (n := s.spec.plain_step(every)) > 0]
        if not due or not names:
            return None
        t0 = time.perf_counter()
        scored = [s for s, _ in due]
        starts = [max(len(s.token_ids) - n, 1) for s, n in due]
        hits = self._hits(scored, starts, names, "at γ = 0")
        if hits is None:
            return None
        for seq, h in zip(scored, hits, strict=True):
            seq.spec.learn(h)
        seconds = time.perf_counter() - t0
        each = seconds / len(scored)
        w = SCORE_TIME_WEIGHT
        self.score_s = each if self.score_s is None else (1 - w) * self.score_s + w * each
        return hits, seconds

    def _hits(self, seqs: list[Sequence], starts: list[int], names: list[str], what: str) -> Hits | None:
        """``pool.prompt_hits``; None where it raised (logged, and every drafter's state reset:
        a failed score costs the drafters their caches, never a request)."""
        try:
            return self.pool.prompt_hits(seqs, starts, names)
        except Exception:
            log.exception(
                "scoring %d sequence(s) (%s) failed; every drafter catches up again", len(seqs), what
            )
            self.on_failure()
            return None
