"""The drafter pool: which drafter drafts, catch-up as the switching cost, and every other
drafter's counterfactual acceptance on the tokens the target just verified (HedgeSpec).

One drafter is active per step (the planner's ``SpeculationPlan.drafter``; None or an unknown name
gives the default, the first model drafter). When it drafts after a step where it did not
(γ was 0, another drafter was active, the draft was reloaded), it first catches up on the
tokens it missed in one batched prefill, timed and reported as a ``SwitchCostEvent``.

Counterfactual acceptance of drafter i at a verified position is 1[its argmax = the kept
token] for greedy sequences, 1[its keyed draw at that position = the kept token] for seeded
sampled ones (what their verification accepts: keyed.py), and Σ_x min(p, q_i) for unseeded
ones (p, q_i warped alike; rejection sampling's acceptance); a step's rate pools every
verified position of the batch. Scoring feeds the verified tokens
into every other model drafter, which also keeps its cache current, so a later switch to it
costs no catch-up. ``every`` bounds the cost: score on every k-th speculative step only
(0: never); a drafter that skipped scoring catches up inside its next score or draft.
"""

from __future__ import annotations

import time
from collections.abc import Collection

import torch

from shared.control import SwitchCostEvent
from worker.engine.keyed import keyed_draw
from worker.engine.sampler import filtered_probs
from worker.engine.sequence import Sequence
from worker.engine.spec.drafter import Drafter
from worker.engine.spec.feature_drafter import FeatureDrafter
from worker.engine.spec.model_drafter import ModelDrafter
from worker.engine.spec.verify import greedy_acceptance, overlap


class DrafterPool:
    def __init__(self, drafters: list[Drafter], every: int = 1) -> None:
        names = [d.name for d in drafters]
        if len(set(names)) != len(names):
            raise ValueError(f"drafter names must be unique, got {names}")
        if not drafters:
            raise ValueError("a drafter pool needs at least one drafter")
        self.drafters = {d.name: d for d in drafters}
        models = [d for d in drafters if isinstance(d, ModelDrafter)]
        self.default = (models or drafters)[0].name
        self.every = every
        self.last_active: str | None = None  # the drafter that drafted at the last decode step
        self._scored_steps = 0

    @property
    def models(self) -> list[ModelDrafter]:
        """Drafters with weights and a KV pool (feature drafters included)."""
        return [d for d in self.drafters.values() if isinstance(d, ModelDrafter)]

    @property
    def features(self) -> list[FeatureDrafter]:
        return [d for d in self.drafters.values() if isinstance(d, FeatureDrafter)]

    def resolve(self, name: str | None) -> Drafter:
        return self.drafters.get(name or self.default) or self.drafters[self.default]

    def catch_up(
        self, drafter: Drafter, seqs: list[Sequence], always: bool = False
    ) -> SwitchCostEvent | None:
        """Catch ``drafter`` up if it did not draft at the last decode step (``always``: in
        any case, as when drafters share a step); the event when it had anything to do."""
        if self.last_active == drafter.name and not always:
            return None
        t0 = time.perf_counter()
        done = drafter.catch_up(seqs)
        seconds = time.perf_counter() - t0
        if done.tokens == 0:
            return None
        return SwitchCostEvent(
            drafter=drafter.name,
            batch_size=done.batch_size,
            tokens=done.tokens,
            seconds=seconds,
            input_len=done.input_len,
        )

    def rollback(self, seq_id: str, num_tokens: int) -> None:
        for d in self.drafters.values():
            d.rollback(seq_id, num_tokens)

    def free(self, seq_id: str) -> None:
        for d in self.drafters.values():
            d.free(seq_id)

    def reset(self) -> None:
        for d in self.drafters.values():
            d.reset()
        self.last_active = None

    def due(self) -> bool:
        """Whether this speculative step scores the other drafters."""
        self._scored_steps += 1
        return self.every > 0 and (self._scored_steps - 1) % self.every == 0

    def counterfactual(
        self,
        active: Drafter,
        seqs: list[Sequence],
        starts: list[int],
        p_rows: list[torch.Tensor | None],
        skip: frozenset[str] = frozenset(),
    ) -> dict[str, float]:
        """Acceptance each drafter but ``active`` (and ``skip``) would have had on positions
        ``starts[i] ..`` of each sequence (``p_rows[i]``: the warped target probabilities at
        those positions, for sampled sequences), pooled over the batch."""
        return pooled(self.counterfactual_hits([active.name] * len(seqs), seqs, starts, p_rows, skip))

    def counterfactual_hits(
        self,
        actives: list[str],
        seqs: list[Sequence],
        starts: list[int],
        p_rows: list[torch.Tensor | None],
        skip: frozenset[str] = frozenset(),
    ) -> list[dict[str, tuple[float, int]]]:
        """Per sequence, (expected accepted positions, positions) among ``starts[i] ..`` for
        every drafter but the one that drafted for it (``actives[i]``) and ``skip``."""
        out: list[dict[str, tuple[float, int]]] = [{} for _ in seqs]
        verified = [seq.token_ids[s:] for seq, s in zip(seqs, starts, strict=True)]
        for d in self.drafters.values():
            if d.name in skip:
                continue
            idx = [i for i, a in enumerate(actives) if a != d.name and verified[i]]
            if not idx:
                continue
            scores = d.score([seqs[i] for i in idx], [starts[i] for i in idx])
            coupled = _coupled_hits(
                [seqs[i] for i in idx], scores.logits, [verified[i] for i in idx]
            )  # seeded sequences, in one batch
            for j, i in enumerate(idx):
                hits = coupled.get(j)
                if hits is None:
                    hits = _hits(seqs[i], scores.tokens[j], scores.logits[j], verified[i], p_rows[i])
                out[i][d.name] = (hits, len(verified[i]))
        return out

    def prompt_hits(
        self, seqs: list[Sequence], starts: list[int], names: Collection[str] | None = None
    ) -> list[dict[str, tuple[float, int]]]:
        """Per sequence, each drafter's (``names``; None: every one) greedy agreement with the
        tokens at positions ``starts[i] ..`` (teacher-forced: the last prompt tokens and the
        first output token of a sequence about to draft; the cost rule's prior, plan.py). A
        model drafter's position without a prediction (no features there) is not counted, nor
        a model-free drafter's empty proposal (the cost rule takes it only where it proposes,
        plan.py)."""
        out: list[dict[str, tuple[float, int]]] = [{} for _ in seqs]
        for d in self.drafters.values():
            if names is not None and d.name not in names:
                continue
            scores = d.score_prompt(seqs, starts)
            for i, (seq, s) in enumerate(zip(seqs, starts, strict=True)):
                pairs = list(zip(scores.tokens[i], seq.token_ids[s:], strict=False))
                judged = [(p, t) for p, t in pairs if p >= 0]
                if judged:
                    out[i][d.name] = (float(sum(p == t for p, t in judged)), len(judged))
        return out


def pooled(counts: list[dict[str, tuple[float, int]]]) -> dict[str, float]:
    """Each drafter's acceptance rate from per-sequence (accepted, judged) counts."""
    num: dict[str, float] = {}
    den: dict[str, int] = {}
    for c in counts:
        for name, (x, n) in c.items():
            num[name] = num.get(name, 0.0) + x
            den[name] = den.get(name, 0) + n
    return {name: num[name] / den[name] for name in num if den[name]}


def _coupled_hits(
    seqs: list[Sequence], logits: list[torch.Tensor | None], kept: list[list[int]]
) -> dict[int, float]:
    """For each seeded sampled sequence j with a drafter's rows ``logits[j]`` (its view of the
    last ``len(kept[j])`` positions): at how many of them its keyed draw — the same noise the
    target drew the kept token with — is the kept token, i.e. keyed verification would accept."""
    js = [j for j, (s, lg) in enumerate(zip(seqs, logits, strict=True)) if s.keyed and lg is not None]
    if not js:
        return {}
    rows = torch.cat([lg for j in js if (lg := logits[j]) is not None])
    params = [seqs[j].params for j in js for _ in kept[j]]
    seeds = [p.seed or 0 for p in params]
    positions: list[int] = []
    for j in js:
        first = seqs[j].position(len(seqs[j].token_ids) - len(kept[j]))
        positions += range(first, first + len(kept[j]))
    drawn = keyed_draw(filtered_probs(rows, params).cpu(), seeds, positions)
    out, at = {}, 0
    for j in js:
        n = len(kept[j])
        out[j] = float(sum(a == b for a, b in zip(drawn[at : at + n], kept[j], strict=True)))
        at += n
    return out


def _hits(
    seq: Sequence, pred: list[int], logits: torch.Tensor | None, kept: list[int], p: torch.Tensor | None
) -> float:
    """Expected accepted positions of one drafter's view ``pred``/``logits`` of ``kept`` (a
    seeded sequence's coupled draws are scored by ``_coupled_hits``)."""
    if seq.params.greedy or p is None or seq.keyed:
        return greedy_acceptance(pred, kept) * len(kept)  # deterministic proposals: realised hits
    p = p[: len(kept)]
    if logits is not None:
        q = filtered_probs(logits, [seq.params] * len(kept)).cpu()
        return float(overlap(p, q).sum())
    return sum(float(p[j, x]) for j, x in enumerate(pred) if x >= 0)  # deterministic: accepted w.p. p(x)
