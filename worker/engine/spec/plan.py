"""The cost rule: each decoding sequence drafts with the (drafter, γ) of least predicted time
per token, at its own acceptance.

The planner's decision carries its prediction of what a step costs (``SpeculationPlan.step_costs``:
at a few batch sizes, a plain step and a step at each γ with each drafter, as served: drafting,
the verify forward and what speculating adds) and each drafter's prior acceptance
(``SpeculationPlan.acceptance``). A step at γ gives a sequence E(α, γ) = (1 − α^(γ+1))/(1 − α) tokens,
so its predicted time per token is ``spec_s / E(α, γ)`` (γ = 0: ``plain_s``); every decoding
sequence takes the smallest at the step's batch size, so the load picks how far to speculate
(a batch the verify forward makes expensive runs γ = 0 whatever the acceptance) and the text
picks the drafter (a code request drafts with the code head beside a chat request on the
chat head, in one step).

A sequence's acceptance per drafter (``SeqSpec``) starts at the planner's prior, counted as
``PRIOR_WEIGHT`` positions; before its first draft every drafter is scored on its prompt
(scoring.py: the prompt ranks the drafters, the planner's prior sets the level). Then its own
verifications (and now and then the other drafters' counterfactuals on them) add up,
discounted by ``DISCOUNT`` per verification so a sequence that changes domain is followed.
A sequence that runs γ = 0 verifies nothing; every few such steps (at least
``PLAIN_SCORE_EVERY``) the model drafters that could pay score its last tokens (scoring.py),
so it learns what they would have drafted: without that, a sequence its prompt put on plain
decoding stayed there.
Nothing here is explored: where the prior says a pair loses, it does not run.

A model-free drafter (n-gram) is judged on the sequence's own verified text at every step, γ = 0
included (lookahead.py: a dictionary lookup): the accepted run length at each judged position,
discounted by ``RUNS_DISCOUNT``, at the positions where it proposed. Once ``RUNS_MIN`` of them
are in, a verification of a proposal at γ is predicted to emit 1 + mean(min(run, γ)) tokens from
those runs instead of E(α, γ): n-gram hits come in runs (on code: nothing at half the positions,
all four at a third), which one per-token α misjudges, and a sequence that turns to code finds
n-gram pays without drafting to learn it. n-gram is taken only at a γ it proposes for the
sequence now (a lookup; nothing proposed: plain decoding, as a verification of nothing is).

Switching is bounded: a sequence keeps its pair for at least K steps unless its batch-size
class (the power of two above its batch size) changes, and a new pair must predict ``MARGIN``
less time per token. K comes from the switching cost (the planner sets it) of the drafter
switched into (``SpeculationPlan.hold_by_drafter``: its catch-up, amortised), else
``SpeculationPlan.hold_steps``; n-gram and plain decoding catch up on nothing, so a switch into
them waits the least K. (Keying K on the pair left instead held plain decoding for a head's K:
32 steps on nj-target, where n-gram's runs on code come and go within 10.) K is for a catch-up
of ``SpeculationPlan.hold_tokens`` tokens; a drafter only L tokens behind the sequence (its
``Drafter.lag``: left a few steps ago, or kept up by its scores) waits ⌈K · L / hold_tokens⌉.
Plain decoding and n-gram are one family for the hold: the steps a sequence spends flipping
between them count toward K together (n-gram proposes on one step and not the next: counted
per pair, the flips reset K's count and the sequence never got back to a model drafter — on
nj-target's stories it drafted with the prose model on 2 % of its drafted steps although that
drafter was 1.44× plain decoding there). Both hold for every drafter that
catches up exactly: a model drafter (its own KV) and a feature head, whose lag is the features
it holds and has not read (feature_drafter.py; past ``MAX_PENDING`` of them its context
restarts, so its lag never exceeds that). Keyed on the held pair instead, a head was almost
never entered on SmolLM2's one-user chat: n-gram proposes on one step and not the next, each
flip restarted the count, and the head's whole K (11–14 steps) never passed (the chat head
drafted 6 % of nightjar's drafted steps there, where static chat head γ 2 was the best
configuration).

Speculation costs nothing where it cannot pay: ``CostRule.could_pay`` is false at a batch size
where no drafter beats a plain step even at its highest plausible acceptance
(``SpeculationPlan.acceptance_hi``); there the engine runs no drafter, scores no prompt, hands no
features over and judges no n-gram lookahead (speculator.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

from shared.control import StepCosts, batch_class
from shared.experts import expected_tokens
from shared.profile import interp
from worker.engine.spec.speculation_plan import SpeculationPlan

PRIOR_WEIGHT = 4.0  # positions the planner's prior acceptance counts as, per sequence and drafter
DISCOUNT = 0.9  # per verification, on a sequence's own counts (~10 verifications)
MARGIN = 0.03  # a new pair must predict this much less time per token than the held one
DEFAULT_ACCEPTANCE = 0.5  # a drafter the decision gives no prior for
RESCORE_EVERY = 16  # a drafting sequence scores the other drafters on every this-many-th verification
RUNS_DISCOUNT = 0.95  # per judged position, on a sequence's model-free run lengths (~20 positions)
RUNS_MIN = 6.0  # judged positions (discounted) before a sequence's runs replace E(α, γ)
PLAIN_SCORE_EVERY = 8  # γ = 0 steps of a sequence between the model drafters' scores, at least
PLAIN_SCORE_MAX = 16  # the last tokens such a score reads at most


@dataclass
class SeqSpec:
    """One sequence's acceptance per drafter and the pair it drafts with now."""

    counts: dict[str, list[float]] = field(default_factory=dict)  # drafter -> [accepted, judged]
    runs: dict[str, list[float]] = field(default_factory=dict)  # model-free drafter -> by run length
    drafter: str | None = None
    gamma: int = 0
    held: int = 0  # steps the current pair has run
    family_held: int = 0  # steps since its drafter last changed, flips between plain and n-gram not counted
    batch_class: int = 0
    prompt_scored: bool = False
    verifications: int = 0
    plain_since: int = 0  # γ = 0 steps since the model drafters last scored this sequence

    def alpha(self, drafter: str, prior: dict[str, float]) -> float:
        accepted, judged = self.counts.get(drafter, (0.0, 0.0))
        m = prior.get(drafter, DEFAULT_ACCEPTANCE)
        return (PRIOR_WEIGHT * m + accepted) / (PRIOR_WEIGHT + judged)

    def add(self, drafter: str, accepted: float, judged: float, weight: float = 1.0) -> None:
        c = self.counts.setdefault(drafter, [0.0, 0.0])
        c[0] += weight * accepted
        c[1] += weight * judged

    def learn(self, counts: dict[str, tuple[float, int]]) -> None:
        """One verification's (accepted, judged) positions per drafter, the older ones discounted."""
        counts = {n: c for n, c in counts.items() if c[1] > 0}
        if not counts:
            return
        for c in self.counts.values():
            c[0], c[1] = DISCOUNT * c[0], DISCOUNT * c[1]
        for name, (accepted, judged) in counts.items():
            self.add(name, accepted, judged)
        self.verifications += 1

    def judged(self, drafter: str, hit: int, proposed: int, depth: int) -> None:
        """One position a model-free drafter was judged at: ``hit`` (0..``depth``) of its
        ``proposed`` tokens led the verified ones. Only positions where it proposed count:
        where it proposes nothing it is not chosen (``CostRule.best``), so its runs are what
        a verification of a proposal emits."""
        if proposed <= 0:
            return
        runs = self.runs.get(drafter)
        if runs is None or len(runs) != depth + 1:
            runs = self.runs[drafter] = [0.0] * (depth + 1)
        for a in range(len(runs)):
            runs[a] *= RUNS_DISCOUNT
        runs[min(max(hit, 0), depth)] += 1.0

    def run_tokens(self, drafter: str, gamma: int) -> float | None:
        """Tokens a verification of a proposal at γ emits by this sequence's runs (None: too
        few judged, or γ beyond the depth judged)."""
        runs = self.runs.get(drafter)
        if runs is None or gamma >= len(runs) or sum(runs) < RUNS_MIN:
            return None
        return 1.0 + sum(c * min(a, gamma) for a, c in enumerate(runs)) / sum(runs)

    def wants_scores(self) -> bool:
        """Whether this verification scores the other drafters (now and then: the prompt
        ranked them already)."""
        return self.verifications % RESCORE_EVERY == RESCORE_EVERY - 1

    def plain_step(self, every: int = PLAIN_SCORE_EVERY) -> int:
        """One γ = 0 step of this sequence: the number of its last tokens (at most
        ``PLAIN_SCORE_MAX``) the model drafters should score now, every ``every``-th such
        step (scoring.plain_score_every); 0: not yet."""
        self.plain_since += 1
        if self.plain_since < every:
            return 0
        n, self.plain_since = self.plain_since, 0
        return min(n, PLAIN_SCORE_MAX)


class CostRule:
    """One plan's step costs, interpolated at any batch size (linear between the batch
    sizes the planner predicted, and beyond the ends)."""

    def __init__(self, plan: SpeculationPlan) -> None:
        costs: Seq[StepCosts] = plan.step_costs
        self.batches = [float(c.batch) for c in costs]
        self.plain_s = [c.plain_s for c in costs]
        names = set.intersection(*(set(c.spec_s) for c in costs)) if costs else set()
        self.drafters = sorted(names)
        self.gamma_max = min((len(c.spec_s[n]) for c in costs for n in names), default=0)
        self.spec_s = {n: [[c.spec_s[n][g] for c in costs] for g in range(self.gamma_max)] for n in names}
        self.prior = dict(plan.acceptance)
        self.hi = {n: plan.acceptance_hi.get(n, self.prior.get(n, DEFAULT_ACCEPTANCE)) for n in names}
        self.hold = plan.hold_steps
        self.hold_by = dict(plan.hold_by_drafter)
        self.hold_tokens = plan.hold_tokens
        self._at: tuple[int, float, dict[str, list[float]]] | None = None  # the last batch's costs
        self._pays: dict[tuple[int, str], bool] = {}  # (batch, drafter) -> could pay (plan-fixed)

    def _costs(self, batch: int) -> tuple[float, dict[str, list[float]]]:
        """The plain step and each drafter's step at each γ, at this batch size (kept for the
        next call: every sequence of a step asks at the same batch size)."""
        if self._at is None or self._at[0] != batch:
            plain = max(interp(self.batches, self.plain_s, batch), 1e-9)
            spec = {
                n: [max(interp(self.batches, c, batch), 1e-9) for c in self.spec_s[n]] for n in self.drafters
            }
            self._at = (batch, plain, spec)
        return self._at[1], self._at[2]

    def __bool__(self) -> bool:
        return bool(self.batches)

    def plain(self, batch: int) -> float:
        return self._costs(batch)[0]

    def loss(
        self, batch: int, drafter: str | None, gamma: int, alpha: float, tokens: float | None = None
    ) -> float:
        """Predicted seconds per token per sequence of a step at (drafter, γ): the step over
        E(α, γ), or over ``tokens`` where the sequence's runs say what a verification emits."""
        if gamma == 0 or drafter is None:
            return self.plain(batch)
        step = self._costs(batch)[1][drafter][gamma - 1]
        return step / (tokens if tokens is not None else expected_tokens(alpha, gamma))

    def best(
        self,
        batch: int,
        alphas: dict[str, float],
        allowed: Seq[str],
        spec: SeqSpec | None = None,
        proposals: dict[str, int] | None = None,
    ) -> tuple[str | None, int, float]:
        """The pair of least predicted time per token (γ = 0 on ties); a model-free drafter
        (``proposals``: the length of what it proposes now) at most at that γ."""
        out: tuple[str | None, int, float] = (None, 0, self.plain(batch))
        for d in self.drafters:
            if d not in allowed:
                continue
            top = min(self.gamma_max, proposals[d]) if proposals and d in proposals else self.gamma_max
            for g in range(1, top + 1):
                tokens = spec.run_tokens(d, g) if spec is not None else None
                loss = self.loss(batch, d, g, alphas[d], tokens)
                if loss < out[2]:
                    out = (d, g, loss)
        return out

    def could_pay(self, batch: int, allowed: Seq[str]) -> bool:
        """Whether any drafter could beat a plain step at this batch size, at its highest
        plausible acceptance."""
        return any(self._could_pay(batch, d) for d in self.drafters if d in allowed)

    def _could_pay(self, batch: int, drafter: str) -> bool:
        """One drafter's answer, kept: it depends on the plan and the batch size only, and the
        speculator asks it of every drafter at every step."""
        key = (batch, drafter)
        if key not in self._pays:
            plain = self.plain(batch)
            hi = self.hi[drafter]
            self._pays[key] = any(
                self.loss(batch, drafter, g, hi) < plain for g in range(1, self.gamma_max + 1)
            )
        return self._pays[key]

    def k_into(self, drafter: str | None, lag: int | None = None) -> int:
        """K of a switch into ``drafter``'s pair (None: plain decoding): the steps the held
        pair must have run first. A switch costs the catch-up of the drafter switched into, so
        its own K (``hold_by``), for a catch-up of ``hold_tokens`` tokens; ``lag``: the tokens
        it is behind the sequence, K in proportion (at least 1). Plain decoding catches up on
        nothing: the least K there is (``hold`` where the plan names none), as n-gram's."""
        if drafter is None:
            return min(self.hold_by.values(), default=self.hold)
        k = self.hold_by.get(drafter, self.hold)
        if lag is None or self.hold_tokens <= 0:
            return k
        return max(1, math.ceil(k * min(max(lag, 0), self.hold_tokens) / self.hold_tokens))

    def choose(
        self,
        spec: SeqSpec,
        batch: int,
        allowed: Seq[str],
        proposals: dict[str, int] | None = None,
        lags: dict[str, int] | None = None,
    ) -> tuple[str | None, int]:
        """This step's pair for one sequence: the best one, unless the held one has run fewer
        than K steps of a switch into the best one's drafter (``k_into``) in the same
        batch-size class or is within ``MARGIN`` of it. ``proposals``: each model-free
        drafter's proposal length for the sequence now; such a drafter is chosen only at a γ it
        proposes, and between it and plain decoding, which cost no catch-up, nothing waits K
        (its proposals come and go from one step to the next). ``lags``: the tokens each
        drafter that catches up exactly (a model drafter, a feature head) is behind; a switch into one waits K
        in proportion, counted over the steps since the sequence's drafter last changed
        (flips between plain decoding and n-gram count together: one family)."""
        proposals, lags = proposals or {}, lags or {}
        alphas = {d: spec.alpha(d, self.prior) for d in self.drafters}
        drafter, gamma, loss = self.best(batch, alphas, allowed, spec, proposals)
        cls = batch_class(batch)
        current = spec.drafter if spec.gamma > 0 else None
        # the held pair as it would run now: a model-free drafter at most at what it proposes
        # (nothing: plain decoding, which the hold then keeps)
        held_gamma = min(spec.gamma, proposals.get(current, spec.gamma)) if current is not None else 0
        if held_gamma == 0:
            current = None
        valid = current is None or (current in allowed and held_gamma <= self.gamma_max)
        free = {None, *proposals}
        same = (drafter, gamma) == (current, held_gamma)
        if not same and valid and cls == spec.batch_class and spec.held > 0:
            held = spec.run_tokens(current, held_gamma) if current is not None else None
            held_loss = self.loss(batch, current, held_gamma, alphas.get(current or "", 0.0), held)
            # a drafter with a lag catches up exactly (a model drafter's own KV, a feature
            # head's held features): K in proportion, counted over the family; any other
            # keeps its whole K and counts the held pair's steps only
            exact = drafter is not None and drafter in lags
            k = 1 if current in free and drafter in free else self.k_into(drafter, lags.get(drafter or ""))
            if (spec.family_held if exact else spec.held) < k or loss > held_loss * (1.0 - MARGIN):
                drafter, gamma = current, held_gamma
                same = True
        family = same or (current in free and drafter in free) or (drafter == current and valid)
        kept = cls == spec.batch_class
        spec.held = spec.held + 1 if same and kept else 1
        spec.family_held = spec.family_held + 1 if family and kept else 1
        spec.drafter, spec.gamma, spec.batch_class = drafter, gamma, cls
        return drafter, gamma
