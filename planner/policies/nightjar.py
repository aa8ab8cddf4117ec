"""``nightjar``: the served default — step costs from the workers' profile, acceptance from what
they verify, and the workers' cost rule choosing (drafter, γ) per sequence and step.

The policy publishes what the cost rule (worker/engine/spec/plan.py) needs and nothing it has
to explore for:

- **step costs** (``Decision.step_costs``) at batch sizes 1, 2, 4, … up to the profile's
  largest: a plain step and a step at each γ ≤ ``gamma_max`` with each drafter, from the
  startup cost profile (γ draft steps of the drafter, then the target over the γ + 1 rows a
  verification runs; n-gram is priced at the γ it proposes: the workers verify only what it
  proposes, and choose it only at a γ it has a proposal for), at the
  served steps' mean context, each scaled by what serving measures beyond the profile (the
  moving ratio of served to predicted time of plain decode steps per batch class — a class
  with fewer than ``KNOWN_STEPS`` plain steps takes what the class seen most serves beyond
  its profile, in seconds, so plain decoding is priced low where nobody measured it and runs
  there until it is measured — times the
  moving excess of speculative steps over it per drafter and batch class: what a drafter adds
  beyond its profiled draft steps is its own — a feature head's catch-up on the features
  of the tokens it did not draft, ~1.2 ms a step on SmolLM2 at one user, which n-gram does
  not pay; shared by every drafter it priced the head as cheap as n-gram, so nightjar drafted
  half its mixed-phase steps with a head that did not win served (open loop, AVX-512 EPYC,
  2026-12-07; on the AVX2 EPYC, where the heads pay served, the A/B is in BENCHMARKS.md §1).
  A drafter whose steps have
  not been seen takes the excess of every speculative step at its class; a class with no
  speculative step yet takes the nearest class's, never below 1), plus the scoring and
  catch-up seconds its speculative steps spend at that class (a moving mean: the work
  speculating brings, which the excess leaves out), plus what the
  worker spends between steps (``gap_time``: its writes, telemetry, intake; per batch class,
  plain and speculative), which a step that emits more tokens pays fewer times a token;
- **acceptance** per drafter (``Decision.acceptance``, ``acceptance_hi``): a discounted Beta of
  the rates the workers report (realised for the drafter that drafted, counterfactual for the
  others they scored; for a model-free drafter, the positions its lookahead judged at every
  step where it proposed, once ``MIN_RUNS`` are in), its mean the prior a new sequence
  starts from, mean + ``z`` standard deviations the highest a sequence could plausibly have —
  where no drafter pays even there, the workers do no speculative work at all (γ = 0 costs
  what static γ = 0 costs). A drafter the workers leave out of their scores (the cost rule
  scores only the drafters that could pay at that bound) learns nothing, so a bound the last
  text set low would keep it out for good: on nj-target the code drafter, priced out by the
  stories phase, was scored in 1 of 8,674 steps of the one-user code phase and drafted none
  (nightjar 0.77 of static code drafter γ 2 there). So while others draft, a drafter
  unscored for ``UNSCORED_STEPS`` steps forgets: its counts fade by ``UNSCORED_DISCOUNT`` a
  drafted step (its mean kept, down to the weight of two positions), its bound rises until
  the workers score it again — on prompts first (one forward over tokens already there), and
  it drafts where a prompt puts a sequence's acceptance where it pays. Steps where nothing
  drafts (a busy batch) fade nothing: there a bound that rose would bring back work at γ = 0;
- **hold_by_drafter** K: a sequence switches into a drafter's pairs only after K steps of
  the pair it holds, unless its batch-size class changes. K amortises the switch as the
  Nightjar paper's loss does (ℓ + C_switch/γ): per drafter, the smallest K with C_switch ≤
  ``switch_share`` · K plain steps at batch 1, C_switch that drafter's profiled catch-up of
  ``switch_tokens`` tokens (n-gram: none; plain decoding, for the workers: the least K),
  within [``hold_min``, ``hold_max``]; ``hold_steps`` is the largest, for older workers.
  ``hold_tokens`` = ``switch_tokens``: a sequence the drafter is fewer tokens behind pays a
  smaller catch-up and waits K in proportion (a drafter left for a few n-gram steps is a few
  tokens behind: on nj-target's stories the full K of 30 steps kept the prose drafter, 1.44×
  plain decoding there, out of 98 % of the drafted steps while n-gram and plain decoding
  alternated);

No exploration: the profile is the prior for every cost, acceptance is what is learned, and it
is learned from the prompts every drafter scores teacher-forced and from the steps that
speculate where the rule says it pays. ``gamma_table`` and ``drafter`` describe the decision
(γ and drafter per bucket at the prior acceptance) for dashboards and older workers. The
draft is offloaded under sustained KV pressure (offload.py), which forces γ = 0.
Without a profile the decision is plain decoding until one arrives.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from planner.policies.base import Choice, Policy
from planner.policies.buckets import Buckets
from planner.policies.offload import OFFLOAD_PARAMS, OffloadRule
from planner.policies.prior import RUNS_DISCOUNT, Beta, Runs
from planner.policies.signals import is_step, prices_gamma, switch_seconds
from shared.control import ALL_BATCHES, StepCosts, Telemetry
from shared.experts import expected_tokens
from shared.policy_params import Param, bool_param, float_param, int_param
from shared.profile import CostProfile

RATIO_WEIGHT = 0.05  # a served step's weight in its class's moving ratio (~20 steps)
RATIO_CLIP = 2.0  # one speculative step's ratio within [plain / this, plain * this]
KNOWN_STEPS = 20  # plain steps before a batch class's ratio is its own (till then: the most-seen class's)
MIN_RUNS = 16.0  # proposing n-gram positions judged (discounted) before its lookahead gives its prior
UNSCORED_STEPS = 64  # drafted steps without a drafter's score before its counts start to fade
UNSCORED_DISCOUNT = 0.995  # per drafted step after that (the weight halves in ~140 steps)


class NightjarPolicy(Policy):
    """Step costs (the workers' profile, calibrated by served steps) and per-drafter acceptance
    for the workers' cost rule: each sequence drafts with the (drafter, γ) of least predicted
    time per token at its own acceptance; nothing is explored; the draft offloaded under KV
    pressure."""

    PARAMS: ClassVar[dict[str, Param]] = {
        "gamma_max": int_param(4, "largest γ (limited by the rows the profile measured)", 1, 16),
        "discount": float_param(0.98, "per update, on each drafter's acceptance counts", 0.5, 1.0),
        "z": float_param(1.5, "acceptance_hi: standard deviations above the mean", 0.0),
        "switch_tokens": int_param(
            64, "tokens a catch-up covers at most (a feature head's pending bound)", 1
        ),
        "switch_share": float_param(0.05, "a switch may cost this share of the K steps it holds", 0.001, 1.0),
        "hold_min": int_param(4, "K at least", 1, 1 << 16),
        "hold_max": int_param(64, "K at most", 1, 1 << 16),
        "calibrate": bool_param(True, "scale the profile by served/predicted step times"),
        "forget_unscored": bool_param(True, "fade the counts of a drafter left unscored while others draft"),
        "own_excess": bool_param(True, "price each drafter at its own served excess (false: one shared)"),
        "charge_scoring": bool_param(
            True, "add what speculative steps spend scoring drafters and catching them up to their cost"
        ),
        "offload": bool_param(True, "offload the draft under memory pressure (see offload_*)"),
        **OFFLOAD_PARAMS,
    }

    def __init__(self, **params: Any) -> None:
        p = {k: spec.default for k, spec in self.PARAMS.items()} | params
        super().__init__(**p)
        if p["hold_min"] > p["hold_max"]:
            raise ValueError("hold_min must not exceed hold_max")
        self.gamma_max: int = p["gamma_max"]
        self.discount: float = p["discount"]
        self.z: float = p["z"]
        self.p = p
        self.profile: CostProfile | None = None
        self.acceptance: dict[str, Beta] = {}
        self.unscored: dict[str, int] = {}  # drafter -> drafted steps since its last score
        self.runs: dict[str, Runs] = {}  # model-free drafters' lookahead
        self.context: float | None = None  # moving mean of the served steps' tokens per sequence
        self.ratio_plain: dict[int, float] = {}  # batch class -> served / predicted, γ = 0 steps
        self.plain_steps: dict[int, int] = {}  # batch class -> γ = 0 steps seen
        self.spec_excess: dict[int, float] = {}  # batch class -> γ > 0 steps' ratio / plain's
        self.drafter_excess: dict[str, dict[int, float]] = {}  # the same, of one drafter's steps
        self.gap: dict[bool, dict[int, float]] = {False: {}, True: {}}  # γ > 0? -> class -> gap_time
        self.scoring: dict[int, float] = {}  # batch class -> scoring and catch-up time of a γ > 0 step
        self.offload = OffloadRule(**{k: p[k] for k in OFFLOAD_PARAMS}) if p["offload"] else None
        self.buckets = Buckets("pow2")

    # ------------------------------------------------------------------ learning

    def use_profile(self, profile: CostProfile) -> None:
        self.profile = profile

    def observe(self, t: Telemetry) -> None:
        if self.offload is not None:
            self.offload.observe(t)
        if not is_step(t):
            return
        if t.mean_context > 0:
            self.context = t.mean_context if self.context is None else _move(self.context, t.mean_context)
        for name, la in t.lookahead.items():
            runs = self.runs.setdefault(name, Runs([0.0] * len(la.accepted), [0.0] * len(la.proposed)))
            runs.add(la, RUNS_DISCOUNT)
        for name, rate in t.counterfactual.items():
            # Realised for the drafters that drafted (weighed by the sequences they drafted
            # for); a counterfactual score of another drafter comes from the few sequences
            # scored now and then (plan.py: every 16th verification): one sequence's weight.
            weight = float(t.drafter_shares.get(name, 0) or 1)
            self.acceptance.setdefault(name, Beta()).add(float(rate), weight, self.discount)
        # Others drafted: a drafter left out of the scores learns nothing.
        if t.drafter_shares and self.p["forget_unscored"]:
            for name, beta in self.acceptance.items():
                n = self.unscored[name] = 0 if name in t.counterfactual else self.unscored.get(name, 0) + 1
                if n > UNSCORED_STEPS:
                    beta.fade(UNSCORED_DISCOUNT)
        if self.p["calibrate"] and t.gamma > 0:
            self._charge_scoring(t)
        if self.p["calibrate"] and prices_gamma(t):
            self._calibrate(t)
            gaps, c = self.gap[t.gamma > 0], _class(t.batch_size)
            if t.gap_time > 0:  # 0: the step came after waiting (or the profiler's own step)
                gaps[c] = t.gap_time if c not in gaps else _move(gaps[c], t.gap_time)

    def _calibrate(self, t: Telemetry) -> None:
        """Move the step's batch class's served/predicted ratio 5 % toward this step's (a class
        new to it from the best-known class's, carried: ``_plain_ratio``).

        What a step spends scoring drafters (prompts of new sequences, counterfactuals every
        16th verification) and catching drafters up is not what its γ costs: it is left out,
        or a speculative step that scored two prompts (42 ms of a 108 ms step at 4 users) sets
        the ratio at 2.2 and no speculative step runs again to correct it. A speculative class
        is priced at its plain ratio times a moving excess (starting at 1, one step's within
        [1 / ``RATIO_CLIP``, ``RATIO_CLIP``]): no single step decides. Each drafter that drafted
        in the step moves its own excess by its share of the step's drafted sequences."""
        predicted = self._predicted(t)
        if predicted is None or predicted <= 0:
            return
        busy = t.step_time - switch_seconds(t) - t.counterfactual_time
        ratio = max(busy, 1e-9) / predicted
        c = _class(t.batch_size)
        if t.gamma > 0:  # relative to the class's plain ratio: what speculating adds
            excess = min(max(ratio / self._plain_ratio(c), 1.0 / RATIO_CLIP), RATIO_CLIP)
            shared = self.spec_excess.get(c, 1.0)
            self.spec_excess[c] = _move(shared, excess)
            drafted = sum(t.drafter_shares.values())
            for d, n in t.drafter_shares.items():
                if n > 0:
                    own = self.drafter_excess.setdefault(d, {})
                    own[c] = _move(own.get(c, shared), excess, n / drafted)
        else:
            # A new class starts from the best-known class's, carried (_plain_ratio; the very
            # first from its own step): one ramp step does not set it.
            before = self._plain_ratio(c) if self.ratio_plain else ratio
            self.ratio_plain[c] = _move(self.ratio_plain.get(c, before), ratio)
            n = self.plain_steps[c] = self.plain_steps.get(c, 0) + 1
            if n == KNOWN_STEPS:  # its own from now: its speculative steps keep their price
                scale = before / self.ratio_plain[c]
                for table in (self.spec_excess, *self.drafter_excess.values()):
                    if c in table:
                        table[c] *= scale

    def _plain_ratio(self, c: int) -> float:
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

    def _charge_scoring(self, t: Telemetry) -> None:
        """Move the class's scoring time of a speculative step 5 % toward this step's.

        Scoring drafters (a new sequence's prompt, every 16th verification's counterfactuals)
        and catching a drafter up are the work speculating brings: none runs where nothing
        can pay. ``_calibrate`` leaves it out of the excess (it does not grow with γ); here it
        is added to every speculative step at the class, as served. One step's share is at most
        the class's plain step as priced, so a warm-up step that scored two prompts moves it by
        a twentieth of a plain step at most. At 32 users on nj-target a new sequence arrives
        every other step and is scored by every drafter: 8–9 ms a speculative step there
        (against ~60 ms of drafting and verifying), which speculation did not pay for."""
        p = self.profile
        if p is None:
            return
        c = _class(t.batch_size)
        cap = p.target(t.batch_size, 1, self.context) * self._ratio(t.batch_size)
        spent = min(t.counterfactual_time + switch_seconds(t), cap)
        self.scoring[c] = _move(self.scoring.get(c, 0.0), spent)  # from nothing: no one step decides

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

    # ------------------------------------------------------------------ deciding

    def _ratio(self, batch: int, drafter: str | None = None) -> float:
        """Served/predicted for a plain step (``drafter`` None) or a speculative step with
        ``drafter`` at this batch size: the drafter's own excess where it drafted at this batch
        class, else every speculative step's at the nearest class seen (a head's excess at one
        sequence says little of a step of 32)."""
        if not self.p["calibrate"]:
            return 1.0
        c = _class(batch)
        plain = self._plain_ratio(c)
        if drafter is None:
            return plain
        own = self.drafter_excess.get(drafter, {}) if self.p["own_excess"] else {}
        if c in own:
            return plain * own[c]
        if c in self.spec_excess:
            return plain * self.spec_excess[c]
        # A class without speculative steps of its own takes no discount from another: below 1
        # an excess is a step's fixed costs spread over a longer predicted step, which says
        # nothing of a busier class (nj-target's one-user stories left 0.71 at one sequence;
        # taken at 32 it priced prose γ 2 at 1.5 plain steps where it serves at 2).
        return plain * max(_nearest(self.spec_excess, c, 1.0), 1.0)

    def _gap(self, batch: int, spec: bool) -> float:
        """What the worker spends between steps, as served (``gap_time``: streaming, telemetry,
        intake), for a plain or a speculative step at this batch size: fewer, longer steps pay
        it fewer times a token, which on a small target is a quarter of a plain step (nj-target
        at one user: 0.76 ms beside 2.15). A speculative class not yet seen takes the plain gap."""
        if not self.p["calibrate"]:
            return 0.0
        c = _class(batch)
        if spec and c in self.gap[True]:
            return self.gap[True][c]
        return _nearest(self.gap[False], c, 0.0)

    def drafters(self) -> list[str]:
        p = self.profile
        return sorted(
            d for d in (p.drafter_s if p is not None else {}) if p is not None and p.drafter(d) == d
        )

    def step_costs(self) -> list[StepCosts]:
        p = self.profile
        if p is None:
            return []
        gmax = min(self.gamma_max, p.gamma_max)
        top = max(p.batches[-1], 1)
        batches = [1 << i for i in range(top.bit_length() + 1) if 1 << i <= top] or [1]
        if batches[-1] != top:
            batches.append(top)
        out = []
        for b in batches:
            plain = p.target(b, 1, self.context) * self._ratio(b) + self._gap(b, False)
            scoring = self.scoring.get(_class(b), 0.0) if self.p["charge_scoring"] else 0.0  # its own class's
            spec = {
                d: [
                    (g * p.draft(b, d) + p.target(b, g + 1, self.context)) * self._ratio(b, d)
                    + self._gap(b, True)
                    + scoring
                    for g in range(1, gmax + 1)
                ]
                for d in self.drafters()
            }
            out.append(StepCosts(batch=b, plain_s=plain, spec_s=spec if gmax > 0 else {}))
        return out

    def priors(self) -> tuple[dict[str, float], dict[str, float]]:
        """Each profiled drafter's acceptance: the mean, and the highest plausible one."""
        mean, hi = {}, {}
        for d in self.drafters():
            beta = self.acceptance.get(d, Beta())
            runs = self.runs.get(d)
            accepted, judged = runs.proposing() if runs is not None else (0.0, 0.0)
            if judged >= MIN_RUNS:  # judged at every step it proposed: not sparse scores
                beta = Beta(1.0 + accepted, 1.0 + judged - accepted)
            n = beta.a + beta.b
            sd = math.sqrt(beta.a * beta.b / (n * n * (n + 1.0)))
            mean[d], hi[d] = beta.mean, min(beta.mean + self.z * sd, 1.0)
        return mean, hi

    def hold_by_drafter(self) -> dict[str, int]:
        """K per drafter: the smallest with its catch-up of ``switch_tokens`` tokens ≤
        ``switch_share`` · K plain steps at batch 1, within [``hold_min``, ``hold_max``]; a
        drafter that catches up on nothing (n-gram) holds ``hold_min``."""
        p, lo, hi = self.profile, self.p["hold_min"], self.p["hold_max"]
        if p is None:
            return {}
        plain = p.target(1, 1, self.context)
        out = {}
        for d in self.drafters():
            measured = d in p.catch_up_s  # not measured: nothing to catch up
            switch = (p.catch_up(1, self.p["switch_tokens"], d) or 0.0) if measured else 0.0
            k = math.ceil(switch / (self.p["switch_share"] * plain)) if plain > 0 else lo
            out[d] = max(lo, min(hi, k))
        return out

    def decide(self, now: float) -> Choice:
        offload = self.offload.decide() if self.offload is not None else False
        costs = [] if offload else self.step_costs()
        if not costs:
            why = "offloaded" if offload else "no cost profile yet"
            return Choice(
                gamma_table=[(ALL_BATCHES, 0)], offload=offload, note=f"nightjar: plain decoding ({why})"
            )
        mean, hi = self.priors()
        table, best = self._describe(costs, mean)
        hold = self.hold_by_drafter()
        return Choice(
            gamma_table=table,
            drafter=best,
            drafter_scope="request",
            score_drafters=True,
            step_costs=costs,
            acceptance=mean,
            acceptance_hi=hi,
            hold_steps=max(hold.values(), default=self.p["hold_min"]),  # older workers: the dearest
            hold_by_drafter=hold,
            hold_tokens=self.p["switch_tokens"],
            offload=offload,
            note="nightjar cost rule γ=" + ",".join(str(g) for _, g in table),
        )

    def _describe(
        self, costs: list[StepCosts], mean: dict[str, float]
    ) -> tuple[list[tuple[int, int]], str | None]:
        """γ per pow2 bucket at the prior acceptance, and the drafter that would run at batch 1."""
        table: list[tuple[int, int]] = []
        first: str | None = None
        for i, c in enumerate(costs):
            name, gamma, loss = None, 0, c.plain_s
            for d, steps in c.spec_s.items():
                for g, s in enumerate(steps, start=1):
                    x = s / expected_tokens(mean.get(d, 0.5), g)
                    if x < loss:
                        name, gamma, loss = d, g, x
            if i == 0:
                first = name
            upper = ALL_BATCHES if i == len(costs) - 1 else c.batch
            table.append((upper, gamma))
        return table, first

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        return {
            "acceptance": {n: [b.a, b.b] for n, b in self.acceptance.items()},
            "runs": {n: [r.accepted, r.proposed] for n, r in self.runs.items()},
            "unscored": dict(self.unscored),
            "context": self.context,
            "ratio_plain": {str(c): r for c, r in self.ratio_plain.items()},
            "plain_steps": {str(c): n for c, n in self.plain_steps.items()},
            "spec_excess": {str(c): r for c, r in self.spec_excess.items()},
            "drafter_excess": {d: {str(c): r for c, r in t.items()} for d, t in self.drafter_excess.items()},
            "gap": {k: {str(c): g for c, g in self.gap[k == "spec"].items()} for k in ("plain", "spec")},
            "scoring": {str(c): s for c, s in self.scoring.items()},
            "offload": self.offload.state_dict() if self.offload is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.acceptance = {
            str(n): Beta(float(v[0]), float(v[1])) for n, v in state.get("acceptance", {}).items()
        }
        self.runs = {str(n): Runs([float(x) for x in v[0]], [float(x) for x in v[1]])
                     for n, v in state.get("runs", {}).items()}  # fmt: skip
        self.unscored = {str(n): int(k) for n, k in state.get("unscored", {}).items()}
        ctx = state.get("context")
        self.context = None if ctx is None else float(ctx)
        self.ratio_plain = {int(c): float(r) for c, r in state.get("ratio_plain", {}).items()}
        known = {c: KNOWN_STEPS for c in self.ratio_plain}  # state saved before the counts: all known
        self.plain_steps = {int(c): int(n) for c, n in state.get("plain_steps", known).items()}
        self.spec_excess = {int(c): float(r) for c, r in state.get("spec_excess", {}).items()}
        own = state.get("drafter_excess", {})
        self.drafter_excess = {str(d): {int(c): float(r) for c, r in t.items()} for d, t in own.items()}
        gap = state.get("gap", {})
        self.gap = {
            k == "spec": {int(c): float(g) for c, g in gap.get(k, {}).items()} for k in ("plain", "spec")
        }
        self.scoring = {int(c): float(s) for c, s in state.get("scoring", {}).items()}
        if self.offload is not None and state.get("offload") is not None:
            self.offload.load_state_dict(state["offload"])


def _move(mean: float, x: float, share: float = 1.0) -> float:
    return mean + RATIO_WEIGHT * share * (x - mean)


def _class(batch: int) -> int:
    return max(int(batch), 1).bit_length()


def _nearest(table: dict[int, float], c: int, default: float) -> float:
    if c in table:
        return table[c]
    if not table:
        return default
    return table[min(table, key=lambda k: (abs(k - c), k))]
