"""``nightjar``: the served default — step costs from the workers' profile, acceptance from what
they verify, and the workers' cost rule choosing (drafter, γ) per sequence and step.

The policy publishes what the cost rule (worker/engine/spec/plan.py) needs and nothing it has
to explore for:

- **step costs** (``Decision.step_costs``) at batch sizes 1, 2, 4, … up to the profile's
  largest: a plain step and a step at each γ ≤ ``gamma_max`` with each drafter, from the
  startup cost profile (γ draft steps of the drafter, then the target over the γ + 1 rows a
  verification runs; n-gram is priced at the γ it proposes: the workers verify only what it
  proposes, and choose it only at a γ it has a proposal for), at the
  served steps' mean context, each scaled by what serving measures beyond the profile
  (served.py: per batch class, the plain steps' served/predicted ratio, each drafter's
  excess over it, the scoring and catch-up a speculative step spends — ``charge_scoring`` —
  and the worker's time between steps);
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
from planner.policies.served import ServedCalibration
from planner.policies.signals import is_step
from shared.control import ALL_BATCHES, StepCosts, Telemetry
from shared.experts import expected_tokens
from shared.policy_params import Param, bool_param, float_param, int_param
from shared.profile import CostProfile

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
        "hold_min": int_param(1, "K at least (n-gram's: it catches up on nothing)", 1, 1 << 16),
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
        self.acceptance: dict[str, Beta] = {}
        self.unscored: dict[str, int] = {}  # drafter -> drafted steps since its last score
        self.runs: dict[str, Runs] = {}  # model-free drafters' lookahead
        self.served = ServedCalibration(calibrate=p["calibrate"], own_excess=p["own_excess"])
        self.offload = OffloadRule(**{k: p[k] for k in OFFLOAD_PARAMS}) if p["offload"] else None
        self.buckets = Buckets("pow2")

    # ------------------------------------------------------------------ learning

    @property
    def profile(self) -> CostProfile | None:
        """The workers' startup cost profile (held by the served calibration, which prices
        with it)."""
        return self.served.profile

    def use_profile(self, profile: CostProfile) -> None:
        self.served.profile = profile

    def observe(self, t: Telemetry) -> None:
        if self.offload is not None:
            self.offload.observe(t)
        if not is_step(t):
            return
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
        self.served.observe(t)

    # ------------------------------------------------------------------ deciding

    def drafters(self) -> list[str]:
        p = self.profile
        return sorted(
            d for d in (p.drafter_s if p is not None else {}) if p is not None and p.drafter(d) == d
        )

    def step_costs(self) -> list[StepCosts]:
        p = self.profile
        if p is None:
            return []
        served, ctx = self.served, self.served.context
        gmax = min(self.gamma_max, p.gamma_max)
        top = max(p.batches[-1], 1)
        batches = [1 << i for i in range(top.bit_length() + 1) if 1 << i <= top] or [1]
        if batches[-1] != top:
            batches.append(top)
        out = []
        for b in batches:
            plain = p.target(b, 1, ctx) * served.ratio(b) + served.gap_at(b, False)
            scoring = served.scoring_at(b) if self.p["charge_scoring"] else 0.0  # its own class's
            spec = {
                d: [
                    (g * p.draft(b, d) + p.target(b, g + 1, ctx)) * served.ratio(b, d)
                    + served.gap_at(b, True)
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
        drafter that catches up on nothing (n-gram) holds ``hold_min``, 1 by default: a
        sequence on a head takes n-gram's run the step it appears (with ``hold_min`` 4 it
        waited 4 steps, n-gram's runs on code come and go within that, and nightjar served
        0.88 of static n-gram γ 4 on one-user code against 1.02 with 1: SmolLM2, 3 rounds,
        Intel Xeon, 2026-12-07, BENCHMARKS.md §1)."""
        p, lo, hi = self.profile, self.p["hold_min"], self.p["hold_max"]
        if p is None:
            return {}
        plain = p.target(1, 1, self.served.context)
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
            **self.served.state_dict(),
            "offload": self.offload.state_dict() if self.offload is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.acceptance = {
            str(n): Beta(float(v[0]), float(v[1])) for n, v in state.get("acceptance", {}).items()
        }
        self.runs = {str(n): Runs([float(x) for x in v[0]], [float(x) for x in v[1]])
                     for n, v in state.get("runs", {}).items()}  # fmt: skip
        self.unscored = {str(n): int(k) for n, k in state.get("unscored", {}).items()}
        self.served.load_state_dict(state)
        if self.offload is not None and state.get("offload") is not None:
            self.offload.load_state_dict(state["offload"])
