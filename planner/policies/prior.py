"""The startup cost profile as the policies' prior: predicted latency per token per (batch,
γ, drafter), with an interval.

A step at γ costs ``profile.step(B, γ, d, context)`` seconds (γ draft steps of drafter d, then
a target pass over γ + 1 rows, at the moving mean of the served steps' tokens per sequence
where the profile measured two contexts) and gives each sequence E(α, γ) = (1 − α^(γ+1))/(1 − α)
tokens, so the predicted latency per token per sequence — the bandit's loss ℓ — is step / E(α, γ) (goodput
is B / ℓ). α is per drafter, from telemetry: each drafter's rate in ``counterfactual`` (the
worker puts the realised accepted/judged of the one that ran there too; failing that, its
acceptance is solved from the step, ``signals.acceptance``), as a discounted
Beta posterior (successes and failures weighted by the positions judged, both multiplied by
``discount`` per update, so old text fades, and by ``IDLE_DISCOUNT`` per step that ran γ = 0
and taught nothing: a policy that stopped speculating becomes unsure of α again, so the γ it
ruled out overlap again and get explored — no deadlock at γ = 0). The interval of ℓ takes α's ±``z`` standard
deviations and ±``time_tol`` on the profile's step time; at γ = 0 only the time is uncertain.
There is no prediction (None) for γ beyond the rows the profile measured, or for γ > 0 when
it measured no drafter.

What only a speculative step costs beyond its forwards is not in the profile: scoring the
other drafters on the verified tokens (HedgeSpec's counterfactuals), a drafter catching up
on a new sequence's prompt, the drafts' bookkeeping. Measured on nj-target at batch 4 that is
~3 ms of a 12.5 ms γ = 2 step, enough to turn a predicted gain into a loss. So the prior
learns it from telemetry (``SpecOverhead``): per power-of-two batch class, the moving mean of
a step's ``other_time`` (catch-ups reported as switch costs excluded: they are charged as
C_switch) on γ > 0 steps minus that on γ = 0 steps, added to every γ > 0 prediction at that
batch (a class not yet seen takes the nearest one's, scaled by batch size; none: 0).

Each prediction carries the loss at α's lower bound, mean and upper bound (``Interval.
paired``): α is shared by every γ of a drafter, so two arms are compared at the same α, each
within its relative uncertainty. ``arm_intervals`` turns one bucket's predictions into its
bandit's arm intervals: every predicted step is shifted by the mean of measured − predicted
step time over the bucket's arms with ``MIN_SAMPLES`` steps (serving adds time the synthetic
steps of the profile do not see — gathering longer contexts, the step's bookkeeping — the same
seconds a step whatever its γ: on nj-target at 4 users a served step took ~3 ms more than the
profile's at every γ; a factor measured/predicted instead would stretch the profile's row
costs by as much and push γ down) — where the profile measured two contexts. Where it
measured one, what serving adds is mostly the longer context, which grows with the rows, and
the predictions are scaled by the ratio measured/predicted instead (SmolLM2, whose budget has
no room for the second context: with the offset it ran γ > 0 on 84 % of its steps at 4 chat
users, where plain decoding is the best, and served 0.92 of it). An arm
whose own data (mean ± Z standard errors) miss its scaled prediction — the profile got its
shape wrong — or that the profile cannot predict keeps its data's interval (or stays unknown
before ``MIN_SAMPLES`` steps), and is compared unpaired. An arm whose data agree combines
both by precision (time tolerance t, the data's relative Z·se d): the mean is the data's with
weight t²/(t² + d²) and the prediction's with the rest, the uncertainty t·d/√(t² + d²), the
prediction's scenarios clipped to the data's interval — a few noisy steps do not outvote the
profile, many settle a near-tie, and an α gone uncertain for want of speculation does not
reopen an arm its own steps have measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from planner.policies.bingreedy import MIN_SAMPLES, BinGreedy, Interval, Z
from planner.policies.signals import acceptance, is_step, switch_seconds
from shared.control import Lookahead, Telemetry
from shared.experts import expected_tokens
from shared.profile import CostProfile

IDLE_DISCOUNT = 0.998  # per step that ran γ = 0 without counterfactuals: α's weight halves in ~350
OVERHEAD_WEIGHT = 0.05  # a new step's weight in the moving means of SpecOverhead (~20 steps)
RUNS_DISCOUNT = 0.99  # per step, on a model-free drafter's lookahead counts (~100 steps)
MIN_RUNS = 16.0  # judged positions (discounted) before the lookahead replaces E(α, γ)


@dataclass
class Beta:
    """A discounted Beta(a, b) posterior of one drafter's per-token acceptance."""

    a: float = 1.0
    b: float = 1.0

    def add(self, rate: float, weight: float, discount: float) -> None:
        rate = min(max(rate, 0.0), 1.0)
        self.a = discount * self.a + rate * weight
        self.b = discount * self.b + (1.0 - rate) * weight

    def fade(self, discount: float) -> None:
        """Forget a little (down to the weight of the uniform prior, Beta(1, 1))."""
        if self.a + self.b > 2.0:
            self.a, self.b = discount * self.a, discount * self.b

    @property
    def mean(self) -> float:
        return self.a / (self.a + self.b)

    def bounds(self, z: float) -> tuple[float, float]:
        n = self.a + self.b
        sd = math.sqrt(self.a * self.b / (n * n * (n + 1.0)))
        return max(self.mean - z * sd, 0.0), min(self.mean + z * sd, 1.0)


@dataclass
class Runs:
    """A model-free drafter's lookahead (worker/engine/spec/lookahead.py), discounted: judged
    positions by accepted length and by proposal length, 0..depth. What every γ ≤ depth would
    give, without E(α, γ)'s i.i.d. assumption: n-gram hits come in runs and its proposals are
    often short, which the tokens and the rows per verification below take as measured."""

    accepted: list[float]
    proposed: list[float]

    @property
    def depth(self) -> int:
        return len(self.accepted) - 1

    @property
    def weight(self) -> float:
        return sum(self.accepted)

    def add(self, la: Lookahead, discount: float) -> None:
        if len(la.accepted) != len(self.accepted) or len(la.proposed) != len(self.proposed):
            self.accepted, self.proposed = [0.0] * len(la.accepted), [0.0] * len(la.proposed)
        self.accepted = [discount * x + n for x, n in zip(self.accepted, la.accepted, strict=True)]
        self.proposed = [discount * x + n for x, n in zip(self.proposed, la.proposed, strict=True)]

    def positions(self) -> tuple[float, float]:
        """(accepted, judged) positions as a per-token acceptance counts them: a run of a < depth
        judges a + 1 positions (the miss included), a full run depth."""
        depth = self.depth
        accepted = sum(c * a for a, c in enumerate(self.accepted))
        misses = sum(c for a, c in enumerate(self.accepted) if a < depth)
        return accepted, accepted + misses

    def proposing(self) -> tuple[float, float]:
        """``positions`` over the positions where it proposed something: what a verification of
        a proposal accepts (a position without one has 0 accepted, counted in ``proposed[0]``)."""
        accepted, judged = self.positions()
        return accepted, max(judged - self.proposed[0], accepted)

    def tokens(self, gamma: int, z: float) -> tuple[float, float, float]:
        """Tokens per verification at γ: (high, mean, low), ± ``z`` standard errors."""
        n = self.weight
        m1 = sum(c * min(a, gamma) for a, c in enumerate(self.accepted)) / n
        m2 = sum(c * min(a, gamma) ** 2 for a, c in enumerate(self.accepted)) / n
        half = z * math.sqrt(max(m2 - m1 * m1, 0.0) / n)
        return 1.0 + min(m1 + half, gamma), 1.0 + m1, 1.0 + max(m1 - half, 0.0)

    def rows(self, gamma: int) -> float:
        """Rows per sequence a verification at γ runs: 1 + the draft tokens proposed."""
        n = max(sum(self.proposed), 1e-9)
        return 1.0 + sum(c * min(length, gamma) for length, c in enumerate(self.proposed)) / n


@dataclass
class _Means:
    """Moving means of one batch class: the unprofiled time of γ > 0 and of γ = 0 steps."""

    spec: float | None = None
    plain: float | None = None
    batch: float = 0.0  # of the γ > 0 steps


def _move(mean: float | None, x: float) -> float:
    return x if mean is None else mean + OVERHEAD_WEIGHT * (x - mean)


class SpecOverhead:
    """Seconds a speculative step spends beyond what the profile models, by batch size."""

    def __init__(self) -> None:
        self.classes: dict[int, _Means] = {}  # batch.bit_length() -> means

    def observe(self, t: Telemetry) -> None:
        other = max(t.other_time - switch_seconds(t), 0.0)
        m = self.classes.setdefault(int(t.batch_size).bit_length(), _Means())
        if t.gamma > 0:
            m.batch = _move(m.batch if m.spec is not None else None, t.batch_size)
            m.spec = _move(m.spec, other)
        else:
            m.plain = _move(m.plain, other)

    def seconds(self, batch: float) -> float:
        known = {c: m for c, m in self.classes.items() if m.spec is not None}
        if not known:
            return 0.0
        c = int(batch).bit_length()
        if c in known:
            m, scale = known[c], 1.0
        else:
            m = known[min(known, key=lambda k: (abs(k - c), k))]
            scale = batch / m.batch if m.batch > 0 else 1.0
        assert m.spec is not None
        plain = m.plain if m.plain is not None else 0.0
        return max(m.spec - plain, 0.0) * scale

    def state_dict(self) -> dict[str, Any]:
        return {str(c): [m.spec, m.plain, m.batch] for c, m in self.classes.items()}

    def load_state_dict(self, s: dict[str, Any]) -> None:
        self.classes = {
            int(c): _Means(None if v[0] is None else float(v[0]), None if v[1] is None else float(v[1]),
                           float(v[2]))
            for c, v in s.items()
        }  # fmt: skip


class ProfilePrior:
    """Predictions from a cost profile and the acceptance telemetry shows."""

    def __init__(self, discount: float = 0.98, z: float = 2.0, time_tol: float = 0.03) -> None:
        self.discount, self.z, self.time_tol = discount, z, time_tol
        self.profile: CostProfile | None = None
        self.acceptance: dict[str, Beta] = {}
        self.running: str | None = None  # the drafter the workers ran last
        self.overhead = SpecOverhead()
        self.runs: dict[str, Runs] = {}  # model-free drafters' lookahead
        self.context: float | None = None  # moving mean of the steps' tokens per sequence

    def use(self, profile: CostProfile) -> None:
        self.profile = profile

    def _add(self, drafter: str, rate: float, weight: float) -> None:
        if weight > 0:
            self.acceptance.setdefault(drafter, Beta()).add(rate, weight, self.discount)

    def observe(self, t: Telemetry) -> None:
        if not is_step(t):
            return
        if t.mean_context > 0:
            self.context = _move(self.context, t.mean_context)
        self.overhead.observe(t)
        for name, la in t.lookahead.items():
            self.runs.setdefault(name, Runs([0.0] * len(la.accepted), [0.0] * len(la.proposed))).add(
                la, RUNS_DISCOUNT
            )
        if t.gamma == 0 and not t.counterfactual:  # nothing learned: what is known fades
            for beta in self.acceptance.values():
                beta.fade(IDLE_DISCOUNT)
            return
        if t.drafter:
            self.running = t.drafter
        alpha = acceptance(t)
        if alpha is not None and t.drafter and t.drafter not in t.counterfactual:
            self._add(t.drafter, alpha, t.accepted + t.num_drafts)  # positions judged, about
        for name, rate in t.counterfactual.items():  # the worker's own rate for the one that ran
            self._add(name, float(rate), t.num_tokens)
        for name, beta in self.acceptance.items():  # not scored (e.g. dominated): it fades too
            if name not in t.counterfactual and name != t.drafter:
                beta.fade(IDLE_DISCOUNT)

    def drafter(self, name: str | None) -> str | None:
        """The drafter ``name`` means: the one the workers ran last for None (their default)."""
        return name if name is not None else self.running

    def best(self, batch: int, gamma: int, drafter: str | None = None) -> tuple[str | None, Interval | None]:
        """``drafter`` and its prediction or, where one predicts a lower loss, a model-free
        drafter its lookahead measures (the per-token counterfactual the drafter choice
        learns from undervalues n-gram's runs; nightjar then publishes that one)."""
        name, best = self.drafter(drafter), self.predict(batch, gamma, drafter)
        for other, runs in sorted(self.runs.items()):
            if other != name and runs.weight >= MIN_RUNS:
                pred = self.predict(batch, gamma, other)
                if pred is not None and (best is None or pred.mean < best.mean):
                    name, best = other, pred
        return name, best

    def step(self, batch: int, gamma: int, drafter: str | None = None) -> float | None:
        """Predicted seconds of a step at (batch, γ, drafter), or None (as ``predict``)."""
        p = self.profile
        if p is None:
            return None
        ctx = self.context
        if gamma == 0:
            return p.target(batch, 1, ctx)
        name = self.drafter(drafter)
        if p.drafter(name) is None or gamma + 1 > p.rows[-1]:
            return None
        runs = self._runs(name, gamma)
        if runs is not None:
            # Measured by lookahead: the verify rows of every γ, as they come.
            step = gamma * p.draft(batch, p.drafter(name)) + p.target(batch, runs.rows(gamma), ctx)
        else:
            step = p.step(batch, gamma, p.drafter(name), ctx)
        return step + self.overhead.seconds(batch)

    def predict(self, batch: int, gamma: int, drafter: str | None = None) -> Interval | None:
        """Predicted latency per token per sequence at (batch, γ, drafter), or None."""
        step = self.step(batch, gamma, drafter)
        if step is None:
            return None
        if gamma == 0:
            return Interval(step, step, step, (step, step, step)).scaled(1.0, self.time_tol)
        name = self.drafter(drafter)
        runs = self._runs(name, gamma)
        if runs is not None:  # the tokens as the lookahead measured them
            return self._interval(tuple(step / e for e in runs.tokens(gamma, self.z)))
        beta = self.acceptance.get(name or "", Beta())
        a_lo, a_hi = beta.bounds(self.z)
        return self._interval(tuple(step / expected_tokens(a, gamma) for a in (a_hi, beta.mean, a_lo)))

    def _runs(self, name: str | None, gamma: int) -> Runs | None:
        """The model-free drafter's lookahead where it has judged enough positions at this γ."""
        runs = self.runs.get(name or "")
        return runs if runs is not None and runs.weight >= MIN_RUNS and gamma <= runs.depth else None

    def _interval(self, paired: tuple[float, ...]) -> Interval:
        """The loss at acceptance's (high, mean, low), widened by the profile's time tolerance."""
        return Interval(paired[1], paired[0], paired[2], paired).scaled(1.0, self.time_tol)

    def state_dict(self) -> dict[str, Any]:
        return {
            "acceptance": {n: [b.a, b.b] for n, b in self.acceptance.items()},
            "running": self.running,
            "overhead": self.overhead.state_dict(),
            "runs": {n: [r.accepted, r.proposed] for n, r in self.runs.items()},
            "context": self.context,
        }

    def load_state_dict(self, s: dict[str, Any]) -> None:
        self.acceptance = {str(n): Beta(float(v[0]), float(v[1])) for n, v in s["acceptance"].items()}
        self.running = s.get("running")
        self.overhead.load_state_dict(s.get("overhead", {}))
        self.runs = {str(n): Runs([float(x) for x in v[0]], [float(x) for x in v[1]])
                     for n, v in s.get("runs", {}).items()}  # fmt: skip
        self.context = None if s.get("context") is None else float(s["context"])


def arm_intervals(
    prior: ProfilePrior, bandit: BinGreedy, batch: int, drafter: str | None
) -> list[Interval | None] | None:
    """Every arm's interval in one bucket (None per arm: nothing known; None: no profile)."""
    if prior.profile is None:
        return None
    best = [prior.best(batch, g, drafter) for g in range(bandit.n_arms)]
    preds = [pred for _, pred in best]
    steps = [prior.step(batch, g, name) if pred is not None else None for g, (name, pred) in enumerate(best)]
    measured = [(a, x) for a, x in enumerate(steps) if x is not None and bandit.counts[a] >= MIN_SAMPLES]
    spent = sum(bandit.seconds[a] for a, _ in measured)
    predicted = sum(bandit.counts[a] * x for a, x in measured)
    n = sum(bandit.counts[a] for a, _ in measured)
    known = [x for x in steps if x is not None]
    # With the profile's second context, what serving adds beyond it is per step: an offset in
    # seconds. Without it, it is mostly the longer context, which grows with the rows: a factor.
    if prior.profile.long_target_s:
        offset = max((spent - predicted) / n, -0.9 * min(known)) if n and known else 0.0
        factors = [(x + offset) / x if x is not None else 1.0 for x in steps]
    else:
        factors = [spent / predicted if predicted > 0 else 1.0] * len(steps)
    means, out = bandit.means, list[Interval | None]()
    for a, pred in enumerate(preds):
        n, m, half = bandit.counts[a], means[a], Z * bandit.stderr(a)
        guess = None if pred is None or steps[a] is None else pred.scaled(factors[a])
        if n >= MIN_SAMPLES and (guess is None or m + half < guess.lo or m - half > guess.hi):
            guess = Interval(m, m - half, m + half)  # no prediction, or the data contradict it
        elif n >= MIN_SAMPLES and guess is not None and m > 0:  # both hold: combined
            d, t = half / m, guess.rel
            rel = t * d / math.hypot(t, d) if t > 0 and d > 0 else 0.0
            w = t * t / (t * t + d * d) if t > 0 or d > 0 else 1.0  # the data's weight
            mean = w * m + (1.0 - w) * guess.mean
            paired = tuple(min(max(x, m - half), m + half) for x in guess.paired)  # within the data
            guess = replace(Interval(mean, 0.0, 0.0, paired).scaled(1.0, rel), mean=mean)
        out.append(guess)
    return out
