"""What serving measures beyond the startup cost profile, per batch class: the calibration the
``nightjar`` policy prices its step costs with.

Per batch class (``batch_class``: 1, 2–3, 4–7, … sequences):

- **plain ratio**: the moving ratio of served to predicted time of plain (γ = 0) decode steps.
  A class with fewer than ``KNOWN_STEPS`` plain steps takes what the class seen most serves
  beyond its profile, in seconds (``plain_ratio``);
- **speculative excess**: the moving ratio of a speculative step's served/predicted time to
  the class's plain ratio, shared and per drafter (a feature head's catch-up on the features
  of the tokens it did not draft, ~1.2 ms a step on SmolLM2 at one user, is its own: n-gram
  does not pay it). A class with no speculative step yet takes the nearest class's, never
  below 1;
- **scoring**: the moving mean of what a speculative step spends scoring drafters and
  catching them up (``charge_scoring``), which the excess leaves out;
- **gap**: what the worker spends between steps (``gap_time``: its writes, telemetry,
  intake) at a plain step, and what a speculative step spends beyond it, which a step that
  emits more tokens pays fewer times a token.

One served step moves each by ``RATIO_WEIGHT`` (~20 steps): no single step decides, and what
speculating adds (the excess, the extra gap) starts from nothing added. A speculative class's
price is learned only from the speculative steps that run in it, and none run where it is
priced out: a few unrepresentative steps (the warm-up's, with prompts arriving) must not set
it. On nj-target (AMD EPYC, 2026-12-08) the first speculative step at one sequence set that
class's gap at 7 ms where a speculative step's is 2.6 (a plain step's 2.2), and a one-step
excess was doubled when the class's plain ratio became its own: nightjar decoded plainly on
every step of one-user code, 0.70 of the code drafter's γ 4. The state layout
(``state_dict``) is the policy's, as it was before this module was split out, with the
learned shares and the extra gap added (an older state loads).
"""

from __future__ import annotations

from typing import Any

from planner.policies.signals import prices_gamma, switch_seconds
from shared.control import Telemetry, batch_class
from shared.profile import CostProfile

RATIO_WEIGHT = 0.05  # a served step's weight in its class's moving ratio (~20 steps)
RATIO_CLIP = 2.0  # one speculative step's ratio within [plain / this, plain * this]
KNOWN_STEPS = 20  # plain steps before a batch class's ratio is its own (till then: the most-seen class's)


class ServedCalibration:
    """Served/predicted step times per batch class, from the workers' telemetry.

    ``calibrate`` false: every ratio is 1 and every gap 0 (the bare profile). ``own_excess``
    false: every drafter takes the class's shared excess."""

    def __init__(self, *, calibrate: bool = True, own_excess: bool = True) -> None:
        self.calibrate = calibrate
        self.own_excess = own_excess
        self.profile: CostProfile | None = None
        self.context: float | None = None  # moving mean of the served steps' tokens per sequence
        self.ratio_plain: dict[int, float] = {}  # batch class -> served / predicted, γ = 0 steps
        self.plain_steps: dict[int, int] = {}  # batch class -> γ = 0 steps seen
        self.spec_excess: dict[int, float] = {}  # batch class -> γ > 0 steps' ratio / plain's
        self.drafter_excess: dict[str, dict[int, float]] = {}  # the same, of one drafter's steps
        # how much of each excess is learned (1 − Π(1 − RATIO_WEIGHT · share)); the rest is the prior, 1
        self.spec_learned: dict[int, float] = {}
        self.drafter_learned: dict[str, dict[int, float]] = {}
        self.gap_plain: dict[int, float] = {}  # batch class -> gap_time of a plain step
        self.gap_extra: dict[int, float] = {}  # batch class -> a speculative step's gap beyond it
        self.scoring: dict[int, float] = {}  # batch class -> scoring and catch-up time of a γ > 0 step

    # ------------------------------------------------------------------ learning

    def observe(self, t: Telemetry) -> None:
        """Learn from one decode step's telemetry."""
        if t.mean_context > 0:
            self.context = t.mean_context if self.context is None else move(self.context, t.mean_context)
        if not self.calibrate:
            return
        if t.gamma > 0:
            self._charge_scoring(t)
        if prices_gamma(t):
            self._calibrate(t)
            if t.gap_time > 0:  # 0: the step came after waiting (or the profiler's own step)
                self._observe_gap(t.gap_time, batch_class(t.batch_size), t.gamma > 0)

    def _observe_gap(self, gap: float, c: int, spec: bool) -> None:
        """A plain step moves its class's gap (its first sets it); a speculative step moves
        the class's extra gap toward its own beyond the plain gap, from none."""
        if not spec:
            self.gap_plain[c] = gap if c not in self.gap_plain else move(self.gap_plain[c], gap)
            return
        extra = gap - nearest(self.gap_plain, c, gap)
        self.gap_extra[c] = move(self.gap_extra.get(c, 0.0), extra)

    def _calibrate(self, t: Telemetry) -> None:
        """Move the step's batch class's served/predicted ratio 5 % toward this step's (a class
        new to it from the best-known class's, carried: ``plain_ratio``).

        What a step spends scoring drafters (prompts of new sequences, counterfactuals every
        16th verification) and catching drafters up is not what its γ costs: it is left out,
        or a speculative step that scored two prompts (42 ms of a 108 ms step at 4 users) sets
        the ratio at 2.2 and no speculative step runs again to correct it. A speculative class
        is priced at its plain ratio times a moving excess (starting at 1, one step's within
        [1 / ``RATIO_CLIP``, ``RATIO_CLIP``]). Each drafter that drafted in the step moves its
        own excess by its share of the step's drafted sequences."""
        predicted = self._predicted(t)
        if predicted is None or predicted <= 0:
            return
        busy = t.step_time - switch_seconds(t) - t.counterfactual_time
        ratio = max(busy, 1e-9) / predicted
        c = batch_class(t.batch_size)
        if t.gamma > 0:  # relative to the class's plain ratio: what speculating adds
            excess = min(max(ratio / self.plain_ratio(c), 1.0 / RATIO_CLIP), RATIO_CLIP)
            shared, shared_learned = self.spec_excess.get(c, 1.0), self.spec_learned.get(c, 0.0)
            self.spec_excess[c] = move(shared, excess)
            self.spec_learned[c] = learn(shared_learned)
            drafted = sum(t.drafter_shares.values())
            for d, n in t.drafter_shares.items():
                if n > 0:
                    own = self.drafter_excess.setdefault(d, {})
                    learned = self.drafter_learned.setdefault(d, {})
                    if c not in own:  # from the class's shared excess, as learned as it is
                        own[c], learned[c] = shared, shared_learned
                    own[c] = move(own[c], excess, n / drafted)
                    learned[c] = learn(learned[c], n / drafted)
        else:
            # A new class starts from the best-known class's, carried (plain_ratio; the very
            # first from its own step): one ramp step does not set it.
            before = self.plain_ratio(c) if self.ratio_plain else ratio
            self.ratio_plain[c] = move(self.ratio_plain.get(c, before), ratio)
            n = self.plain_steps[c] = self.plain_steps.get(c, 0) + 1
            if n == KNOWN_STEPS:  # its own from now: its speculative steps keep their price
                self._rescale(c, before / self.ratio_plain[c])

    def _rescale(self, c: int, scale: float) -> None:
        """The class's plain ratio changed by 1 / ``scale``: what its excesses learned keeps its
        price in seconds, the rest stays the prior (1: as the profile prices speculating
        beside a plain step). Scaled whole, the excess of one warm-up step at one sequence
        (1.04, learned at 5 %) became 2.07 on nj-target, and speculating was priced out there."""
        tables = [(self.spec_excess, self.spec_learned)]
        tables += [(own, self.drafter_learned.get(d, {})) for d, own in self.drafter_excess.items()]
        for table, learned in tables:
            if c in table:
                prior = 1.0 - learned.get(c, 1.0)
                table[c] = prior + (table[c] - prior) * scale

    def _charge_scoring(self, t: Telemetry) -> None:
        """Move the class's scoring time of a speculative step 5 % toward this step's.

        Scoring drafters (a new sequence's prompt, every 16th verification's counterfactuals)
        and catching a drafter up are the work speculating brings: none runs where nothing
        can pay. ``_calibrate`` leaves it out of the excess (it does not grow with γ); the
        policy adds it to every speculative step at the class, as served. One step's share is
        at most the class's plain step as priced, so a warm-up step that scored two prompts
        moves it by a twentieth of a plain step at most. At 32 users on nj-target a new
        sequence arrives every other step and is scored by every drafter: 8–9 ms a
        speculative step there (against ~60 ms of drafting and verifying)."""
        p = self.profile
        if p is None:
            return
        c = batch_class(t.batch_size)
        cap = p.target(t.batch_size, 1, self.context) * self.ratio(t.batch_size)
        spent = min(t.counterfactual_time + switch_seconds(t), cap)
        self.scoring[c] = move(self.scoring.get(c, 0.0), spent)  # from nothing: no one step decides

    def _predicted(self, t: Telemetry) -> float | None:
        """The profile's time for the step ``t`` ran (uncalibrated)."""
        p = self.profile
        if p is None:
            return None
        b = t.batch_size
        rows = 1.0 + t.proposed / b
        drafting = sum(
            t.gamma * p.draft(n, d) for d, n in t.drafter_shares.items() if p.drafter(d) == d
        )  # each group's draft steps (γ is the step's largest: an upper bound)
        return p.target(b, rows, self.context) + drafting

    # ------------------------------------------------------------------ pricing

    def plain_ratio(self, c: int) -> float:
        """The class's plain ratio once it is known (``KNOWN_STEPS`` plain steps). Before, the
        class seen most, carried over as what it serves beyond its profile in seconds (a
        step's fixed costs, which a longer forward does not multiply): on nj-target's one-user
        stories nightjar's few plain steps served at 4.7× their 1.6 ms profile; as a ratio at
        32 users that priced a plain step at 58 ms where it serves at 30, nightjar speculated
        on every step there and no plain step ran to correct it. Carried as seconds it is
        priced low, nightjar decodes plainly there, and the class learns its own."""
        if not self.ratio_plain:
            return 1.0
        if self.plain_steps.get(c, 0) >= KNOWN_STEPS:
            return self.ratio_plain[c]
        k = max(self.ratio_plain, key=lambda k: (self.plain_steps.get(k, 0), -abs(k - c), -k))
        if k == c or self.profile is None:
            return self.ratio_plain[k]
        pk, pc = (self.profile.target(1 << (x - 1), 1, self.context) for x in (k, c))
        return max(1.0 + (self.ratio_plain[k] - 1.0) * pk / max(pc, 1e-9), 0.25)

    def ratio(self, batch: int, drafter: str | None = None) -> float:
        """Served/predicted for a plain step (``drafter`` None) or a speculative step with
        ``drafter`` at this batch size: the drafter's own excess where it drafted at this batch
        class, else every speculative step's at the nearest class seen (a head's excess at one
        sequence says little of a step of 32)."""
        if not self.calibrate:
            return 1.0
        c = batch_class(batch)
        plain = self.plain_ratio(c)
        if drafter is None:
            return plain
        own = self.drafter_excess.get(drafter, {}) if self.own_excess else {}
        if c in own:
            return plain * own[c]
        if c in self.spec_excess:
            return plain * self.spec_excess[c]
        # A class without speculative steps of its own takes no discount from another: below 1
        # an excess is a step's fixed costs spread over a longer predicted step, which says
        # nothing of a busier class (nj-target's one-user stories left 0.71 at one sequence;
        # taken at 32 it priced prose γ 2 at 1.5 plain steps where it serves at 2).
        return plain * max(nearest(self.spec_excess, c, 1.0), 1.0)

    def gap_at(self, batch: int, spec: bool) -> float:
        """What the worker spends between steps, as served (``gap_time``: streaming, telemetry,
        intake), for a plain or a speculative step at this batch size: fewer, longer steps pay
        it fewer times a token, which on a small target is a quarter of a plain step (nj-target
        at one user: 0.76 ms beside 2.15). A speculative step pays the plain gap and its class's
        extra (none where its class has not speculated)."""
        if not self.calibrate:
            return 0.0
        c = batch_class(batch)
        plain = nearest(self.gap_plain, c, 0.0)
        return max(plain + self.gap_extra.get(c, 0.0), 0.0) if spec else plain

    def scoring_at(self, batch: int) -> float:
        """The scoring and catch-up seconds of a speculative step at this batch size's own
        class (an unseen class: none)."""
        return self.scoring.get(batch_class(batch), 0.0) if self.calibrate else 0.0

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        return {
            "context": self.context,
            "ratio_plain": {str(c): r for c, r in self.ratio_plain.items()},
            "plain_steps": {str(c): n for c, n in self.plain_steps.items()},
            "spec_excess": {str(c): r for c, r in self.spec_excess.items()},
            "drafter_excess": {d: {str(c): r for c, r in t.items()} for d, t in self.drafter_excess.items()},
            "spec_learned": {str(c): f for c, f in self.spec_learned.items()},
            "drafter_learned": {
                d: {str(c): f for c, f in t.items()} for d, t in self.drafter_learned.items()
            },
            "gap": {
                "plain": {str(c): g for c, g in self.gap_plain.items()},
                "spec_extra": {str(c): g for c, g in self.gap_extra.items()},
            },
            "scoring": {str(c): s for c, s in self.scoring.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        ctx = state.get("context")
        self.context = None if ctx is None else float(ctx)
        self.ratio_plain = {int(c): float(r) for c, r in state.get("ratio_plain", {}).items()}
        known = {c: KNOWN_STEPS for c in self.ratio_plain}  # state saved before the counts: all known
        self.plain_steps = {int(c): int(n) for c, n in state.get("plain_steps", known).items()}
        self.spec_excess = {int(c): float(r) for c, r in state.get("spec_excess", {}).items()}
        own = state.get("drafter_excess", {})
        self.drafter_excess = {str(d): {int(c): float(r) for c, r in t.items()} for d, t in own.items()}
        # a state saved before the learned shares: every excess counts as learned
        saved = state.get("spec_learned", {})
        self.spec_learned = {c: float(saved.get(str(c), 1.0)) for c in self.spec_excess}
        learned = state.get("drafter_learned", {})
        self.drafter_learned = {
            d: {c: float(learned.get(d, {}).get(str(c), 1.0)) for c in t}
            for d, t in self.drafter_excess.items()
        }
        gap = state.get("gap", {})
        self.gap_plain = {int(c): float(g) for c, g in gap.get("plain", {}).items()}
        self.gap_extra = {int(c): float(g) for c, g in gap.get("spec_extra", {}).items()}
        for c, g in gap.get("spec", {}).items():  # saved before the extra: a speculative step's whole gap
            self.gap_extra.setdefault(int(c), float(g) - nearest(self.gap_plain, int(c), float(g)))
        self.scoring = {int(c): float(s) for c, s in state.get("scoring", {}).items()}


def move(mean: float, x: float, share: float = 1.0) -> float:
    """``mean`` moved ``RATIO_WEIGHT`` · ``share`` of the way toward ``x``."""
    return mean + RATIO_WEIGHT * share * (x - mean)


def learn(learned: float, share: float = 1.0) -> float:
    """How much of a moving mean is learned after one more step of ``share`` (``move``)."""
    return learned + RATIO_WEIGHT * share * (1.0 - learned)


def nearest(table: dict[int, float], c: int, default: float) -> float:
    """The class's entry, else the nearest class's (the smaller on a tie), else ``default``."""
    if c in table:
        return table[c]
    if not table:
        return default
    return table[min(table, key=lambda k: (abs(k - c), k))]
