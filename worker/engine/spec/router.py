"""Per-request drafter choice: each sequence follows its own full-information learner.

HedgeSpec's guarantee is per query: against the best drafter *for that request*. With
``SpeculationPlan.drafter_scope == "request"`` the engine gives every decoding sequence its own
``ExpertLearner`` (shared/experts.py; kind and forgetting from the decision) over the pool's
drafters. A new sequence drafts first with the planner's batch-level choice
(``SpeculationPlan.drafter``: the prior, learnt over every request); after each verification it
learns, for every drafter, a loss from the acceptance on *its own* verified positions — the
realised acceptance of the drafter that drafted, the counterfactual acceptance of the others
(pool.py) — and drafts next with its top-weight drafter, kept unless another leads by more
than ``MARGIN`` (a switch costs the new drafter a catch-up; with full information
randomising buys nothing, as in the planner's chooser). One step drafts each group of
sequences with its own drafter, so a batch mixing code and chat requests drafts each with
the drafter that suits it.

Each verification adds, per drafter, the positions judged and accepted to the sequence's
discounted tally (``TALLY_DISCOUNT``); the loss is taken at the tally's rate, not at the
verification's own: E(α, γ) is convex, so a rate from the one or two positions a short
verification judges overstates a drafter's tokens (a model drafter scored on the single token
an empty n-gram proposal verified has rate 0 or 1, E 1 or 5: on nj-target's stories at 4 users
that sent half the sequences to the prose drafter, 0.94× static n-gram-4).

The loss is 1 − acceptance, or, where the planner tells what each drafter costs
(``SpeculationPlan.drafter_costs``: c_d, a draft step's time over a plain target step), 1 − the
drafter's speed: u_d = E(r_d, γ) / ((γ + 1)(1 + γ·c_d)), the tokens a step of γ drafts by d
would give (E(α, γ) = (1 − α^(γ+1))/(1 − α) at its acceptance rate r_d) per unit of time,
over the most any drafter could give (every draft accepted, drafting free). A drafter twice
as often right but costing a third of a target step a draft loses to a free one (n-gram) that
is right a third of the time: on nj-target at 4 users static n-gram γ = 4 served 1.12×
plain decoding, nj-draft-prose γ = 4 1.00×, though it was accepted 0.54 against 0.33.

Scoring the other drafters costs a forward of each of them per verification, so a sequence
whose learner has settled — ``SETTLE_ROUNDS`` verifications learnt, its drafter holding at
least ``SETTLE_WEIGHT`` of the weight — is scored only on every ``RESCORE_EVERY``-th
verification after that (enough to notice its text change domain); until then, every one.

The learner lives on the ``Sequence`` (``drafter_choice``), so it is freed with it and
survives a preemption. Drafter choice never changes what is emitted: verification keeps the
output the target's alone.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from shared.experts import ExpertLearner, drafter_speed

MARGIN = 0.05  # the weight lead a drafter needs to displace a sequence's current one
SETTLE_ROUNDS = 6  # verifications a learner learns from before it may settle
SETTLE_WEIGHT = 0.9  # a settled learner's drafter holds at least this weight
RESCORE_EVERY = 8  # a settled sequence is scored on every this-many-th verification
TALLY_DISCOUNT = 0.9  # per verification, on a sequence's acceptance counts (~10 verifications)


@dataclass
class DrafterChoice:
    """One sequence's learner over the drafters and the drafter it drafts with now."""

    learner: ExpertLearner
    current: str
    rounds: int = 0  # verifications learnt from
    switches: int = 0
    unscored: int = 0  # verifications since the last one it learnt from
    tally: dict[str, list[float]] = field(default_factory=dict)  # drafter -> [accepted, judged], discounted

    def wants_scores(self) -> bool:
        """Whether this verification should score the other drafters for this sequence."""
        if self.rounds < SETTLE_ROUNDS or self.unscored + 1 >= RESCORE_EVERY:
            return True
        return self.learner.weights().get(self.current, 0.0) < SETTLE_WEIGHT

    def skip(self) -> None:
        """A verification without scores."""
        self.unscored += 1

    def rate(self, name: str) -> float:
        """The drafter's acceptance on this sequence so far: its discounted tally under a
        Beta(1, 1) prior."""
        accepted, judged = self.tally.get(name, (0.0, 0.0))
        return (accepted + 1.0) / (judged + 2.0)

    def preferred(self, gamma: int, costs: dict[str, float]) -> str:
        """The drafter this sequence's own rates favour at each drafter's plain (unshared)
        cost: the one it would draft with were its choice everyone's. Its current drafter
        until it has rates."""
        if gamma <= 0 or not self.tally:
            return self.current
        speed = {n: drafter_speed(self.rate(n), gamma, costs.get(n, 0.0)) for n in self.tally}
        return max(sorted(speed), key=lambda n: speed[n])

    def learn(
        self, counts: dict[str, tuple[float, int]], gamma: int = 0, costs: dict[str, float] | None = None
    ) -> None:
        """One verification's (accepted, judged) positions per drafter at γ drafts; then the
        next pick. The loss is 1 − the drafter's speed at its rate so far (with ``costs``;
        else 1 − that rate), not at this verification's own few positions."""
        counts = {n: c for n, c in counts.items() if c[1] > 0}
        if not counts:
            return
        for name, (accepted, judged) in counts.items():
            t = self.tally.setdefault(name, [0.0, 0.0])
            t[0], t[1] = TALLY_DISCOUNT * t[0] + accepted, TALLY_DISCOUNT * t[1] + judged
        rates = {name: self.rate(name) for name in counts}
        if costs and gamma > 0:
            losses = {n: 1.0 - drafter_speed(r, gamma, costs.get(n, 0.0)) for n, r in rates.items()}
        else:
            losses = {name: 1.0 - rate for name, rate in rates.items()}
        self.learner.update(losses)
        self.rounds += 1
        self.unscored = 0
        weights = self.learner.weights()
        leader = max(sorted(weights), key=lambda n: weights[n])
        if weights[leader] > weights.get(self.current, -1.0) + MARGIN:
            self.current = leader
            self.switches += 1


def shared_costs(costs: dict[str, float], groups: Counter[str], own: str, batch: int) -> dict[str, float]:
    """Each drafter's cost as one sequence's learner should weigh it: a draft step is paid by
    the whole step, whatever number of sequences draft with it, so a drafter that ``n`` of the
    ``batch`` sequences would draft with (counting this one, were it to switch) costs
    ``batch / n`` times its cost. Measured on nj-target at 4 users on stories: with the plain
    per-drafter cost, 15 % of the sequences followed the prose drafter (accepted more often on
    some stories), and every speculative step paid its forward: 0.675× static n-gram-4.

    ``groups`` counts, per drafter, the sequences whose own rates favour it
    (``DrafterChoice.preferred``), not the ones drafting with it now: counted by current use,
    a drafter nobody uses yet costs its whole forward to the first sequence that would switch,
    so a batch that started on n-gram stayed there (SmolLM2 at 4 chat users, 2026-12-03: 80 % of
    sequences on n-gram at acceptance 0.1, where the chat head alone was the best static
    configuration)."""
    return {d: c * batch / max(groups.get(d, 0) + (d != own), 1) for d, c in costs.items()}
