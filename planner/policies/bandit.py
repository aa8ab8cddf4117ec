"""``bandit``: the Nightjar paper's planner as first built here — a contextual bandit for γ per
batch-size bucket with a switching cost, HedgeSpec drafter choice, and draft offload under
memory pressure. The served default is now ``nightjar`` (nightjar.py: the cost rule, no
exploration); this one stays for comparison (``--policy bandit``, the simulator)."""

from __future__ import annotations

from typing import Any, ClassVar

from planner.policies.base import Choice, Policy
from planner.policies.bingreedy import EXPLORE_RULES, BinGreedy
from planner.policies.buckets import Buckets
from planner.policies.drafter import HEDGE_PARAMS, DrafterChooser
from planner.policies.offload import OFFLOAD_PARAMS, OffloadRule
from planner.policies.prior import ProfilePrior, arm_intervals
from planner.policies.signals import Draws, busy_time, is_step, prices_gamma, tokens_per_sequence
from planner.policies.switch_cost import SwitchCostModel
from planner.policies.transitions import Transitions
from shared.control import Telemetry
from shared.policy_params import Param, bool_param, float_param, int_list_param, int_param, str_param
from shared.profile import CostProfile

_HEDGE = {f"hedge_{k}": p for k, p in HEDGE_PARAMS.items() if k != "drafters"}


class BanditPolicy(Policy):
    """Per bucket, a bin-greedy bandit over γ ∈ {0..gamma_max} minimising latency per token
    plus C_switch/γ when speculation would be switched back on.

    Each bucket's arm is locked per bin; the published gamma_table holds every bucket's
    current arm. Rewards are attributed to the (bucket, γ) a step actually ran with.
    C_switch comes from the workers' catch-up measurements (a prior until measured), looked
    up at the tokens skipped since speculation stopped (capped by the context) and the
    bucket's batch size. With ``drafter_policy="hedge"`` the drafter follows NormalHedge on
    counterfactual acceptance — weighed against each drafter's profiled cost when there is a
    profile (``shared.experts.drafter_speed``; the costs are published for the per-request
    learners too); with ``offload`` the draft is squeezed out under sustained
    memory pressure while γ = 0 and reloaded when load falls (γ = 0 everywhere meanwhile).
    Given a startup cost profile (``use_profile``), each bin starts from the predicted loss
    of every γ at the bucket's batch size (prior.py) and explores only among the γ whose
    predicted interval overlaps the best one's.
    """

    PARAMS: ClassVar[dict[str, Param]] = {
        "gamma_max": int_param(4, "largest γ (arms are 0..gamma_max)", 1, 16),
        "buckets": int_list_param(
            "pow2", "batch-size buckets: pow2, pairs (the authors' fork) or upper bounds", ("pow2", "pairs")
        ),
        "explore": str_param("per-block", "exploration coin per bin (see docs)", EXPLORE_RULES),
        "bin_slack": int_param(32, "extra steps a bin waits for its γ to run before it ends anyway", 0),
        "switch_cost": bool_param(True, "add C_switch/γ when leaving γ = 0 (False: plain bandit)"),
        "switch_prior_s": float_param(1e-4, "C_switch prior: seconds per skipped token per sequence", 0.0),
        "switch_fixed_s": float_param(1e-3, "C_switch prior: fixed seconds per catch-up", 0.0),
        "seed": int_param(0, "seed of the exploration draws", 0),
        "drafter_policy": str_param("hedge", "drafter choice: HedgeSpec or fixed", ("hedge", "fixed")),
        "drafter": str_param(None, "the drafter when drafter_policy=fixed (None: the worker's default)"),
        "drafters": HEDGE_PARAMS["drafters"],
        **_HEDGE,
        "prior": bool_param(True, "use a published cost profile as the prior (False: ignore it)"),
        "prior_z": float_param(2.0, "prior: standard deviations of acceptance in an interval", 0.0),
        "prior_time_tol": float_param(0.03, "prior: relative uncertainty of a profiled step time", 0.0),
        "offload": bool_param(True, "offload the draft under memory pressure (see offload_*)"),
        **OFFLOAD_PARAMS,
    }

    def __init__(self, **params: Any) -> None:
        p = {k: spec.default for k, spec in self.PARAMS.items()} | params
        super().__init__(**p)
        self.gamma_max: int = p["gamma_max"]
        self.buckets = Buckets(p["buckets"])
        arms = self.gamma_max + 1
        self.bandits = [BinGreedy(arms, p["explore"], p["bin_slack"]) for _ in self.buckets.uppers]
        self.use_switch_cost: bool = p["switch_cost"]
        self.switch = SwitchCostModel(p["switch_prior_s"], p["switch_fixed_s"])
        self.draws = Draws(p["seed"])
        self.fixed_drafter: str | None = p["drafter"]
        self.chooser = (
            DrafterChooser(**{k: p[f"hedge_{k}"] for k in ("learner", "discount", "select", "margin", "scope")},  # noqa: E501
                           drafters=p["drafters"], seed=p["seed"])
            if p["drafter_policy"] == "hedge" else None
        )  # fmt: skip
        offload_params = {k: p[k] for k in OFFLOAD_PARAMS}
        self.offload = OffloadRule(**offload_params) if p["offload"] else None
        self.last_batch = [self.buckets.representative(i) for i in range(len(self.buckets))]
        self.recent_batch = 1  # the batch size of the last step seen
        self.transitions = Transitions(len(self.buckets))
        self.use_prior: bool = p["prior"]
        self.prior = ProfilePrior(p["hedge_discount"], p["prior_z"], p["prior_time_tol"])
        for bandit in self.bandits:
            bandit.start_bin(self.draws)

    def _drafter(self) -> str | None:
        return self.chooser.current if self.chooser is not None else self.fixed_drafter

    def switch_terms(self, i: int) -> tuple[float, float, float]:
        """Bucket ``i``'s switch costs for BinGreedy.greedy: (now, on, off), in seconds."""
        if not self.use_switch_cost:
            return 0.0, 0.0, 0.0
        tr, drafter, arms = self.transitions, self._drafter(), [b.arm for b in self.bandits]
        now = self.switch.cost(drafter, tr.off_tokens(), self.last_batch[i])
        on = sum(
            p * self.switch.cost(drafter, tr.visit_tokens(j), self.last_batch[i])
            for j, p in enumerate(tr.into(i))
            if p > 0 and arms[j] == 0
        )
        off = sum(
            p * self.switch.cost(drafter, tr.visit_tokens(i), self.last_batch[j]) / arms[j]
            for j, p in enumerate(tr.out_of(i))
            if p > 0 and arms[j] > 0
        )
        return now, on, off

    def use_profile(self, profile: CostProfile) -> None:
        """The prior from now on; a bin that has not run a step yet chooses again with it."""
        if not self.use_prior:
            return
        self.prior.use(profile)
        self.switch.before = lambda d, tokens, batch: profile.catch_up(batch, tokens, self.prior.drafter(d))
        for i, bandit in enumerate(self.bandits):
            bandit.rechoose(self.draws, self.switch_terms(i), self.intervals(i))

    def drafter_costs(self, batch: int) -> dict[str, float]:
        """Each profiled drafter's draft step over a plain target step at ``batch`` (empty
        without a profile): what the drafter choices weigh acceptance against."""
        p = self.prior.profile
        if p is None or not p.drafter_s:
            return {}
        plain = p.target(batch, 1, self.prior.context)
        return {d: p.draft(batch, d) / plain for d in p.drafter_s}

    def dominated(self, costs: dict[str, float], keep: str | None) -> list[str]:
        """Drafters surely slower than the best at γ_max (none without ``costs``, i.e. without a
        profile): the prior's predicted latency per token (``ProfilePrior.predict``: draft and
        verify forwards from the profile, acceptance from telemetry, n-gram's runs and rows
        from its lookahead) at its best case above the best drafter's at its worst. Not scored
        meanwhile, their acceptance fades (prior.py) until the intervals overlap again and
        they are scored once more. (Judged by its per-token counterfactual alone, n-gram
        looked dominated on stories at 4 users, where it was the fastest: its hits come in
        runs, and with no proposal it verifies one row.)"""
        if len(costs) < 2:
            return []
        preds = {}
        for d in costs:
            if d not in self.prior.acceptance and d not in self.prior.runs:
                return []  # a drafter not yet scored: everything is still open
            pred = self.prior.predict(self.recent_batch, self.gamma_max, d)
            if pred is None:
                return []
            preds[d] = pred
        best = min(preds, key=lambda d: (preds[d].hi, d))
        return sorted(d for d, p in preds.items() if p.lo > preds[best].hi and d != keep)

    def intervals(self, i: int) -> list[Any] | None:
        """Bucket ``i``'s arm intervals from the prior (None: no profile)."""
        return arm_intervals(self.prior, self.bandits[i], self.last_batch[i], self._drafter())

    def observe(self, t: Telemetry) -> None:
        if self.offload is not None:
            self.offload.observe(t)
        if self.chooser is not None:
            self.chooser.observe(t, self.drafter_costs(t.batch_size))
        if is_step(t):
            self.recent_batch = t.batch_size
        self.prior.observe(t)
        for event in t.switch_costs:
            self.switch.observe(event)
        if not is_step(t):
            return
        i = self.buckets.index(t.batch_size)
        self.transitions.observe(t.worker_id, i, t.gamma, t.mean_context)
        self.last_batch[i] = t.batch_size
        bandit = self.bandits[i]
        if t.gamma <= self.gamma_max and prices_gamma(t):
            bandit.record(t.gamma, busy_time(t), tokens_per_sequence(t))
        if bandit.tick(t.gamma, t.draft_resident and not t.fallback):
            bandit.start_bin(self.draws, self.switch_terms(i), self.intervals(i))

    def decide(self, now: float) -> Choice:
        drafter = self.chooser.choose() if self.chooser is not None else self.fixed_drafter
        offload = self.offload.decide() if self.offload is not None else False
        gammas = [0 if offload else b.arm for b in self.bandits]
        gamma = gammas[self.buckets.index(self.recent_batch)]
        if self.chooser is not None and gamma > 0 and self.use_prior:
            drafter = self.prior.best(self.recent_batch, gamma, drafter)[0] or drafter
        explore = [i for i, b in enumerate(self.bandits) if b.explore]
        costs = self.drafter_costs(self.recent_batch) if self.chooser is not None else {}
        return Choice(
            gamma_table=self.buckets.table(gammas),
            drafter=drafter,
            drafter_scope=self.chooser.scope if self.chooser is not None else "batch",
            score_drafters=self.chooser is not None,
            drafter_costs=costs,
            skip_drafters=self.dominated(costs, drafter),
            offload=offload,
            note=f"bandit γ={gammas}" + (" offload" if offload else ""),
            extra={"exploring": explore},
        )

    def state_dict(self) -> dict[str, Any]:
        return {
            "shape": {"gamma_max": self.gamma_max, "uppers": list(self.buckets.uppers)},
            "bandits": [b.state_dict() for b in self.bandits],
            "draws": self.draws.state(),
            "switch": self.switch.state_dict(),
            "chooser": self.chooser.state_dict() if self.chooser is not None else None,
            "offload": self.offload.state_dict() if self.offload is not None else None,
            "last_batch": list(self.last_batch),
            "recent_batch": self.recent_batch,
            "transitions": self.transitions.state_dict(),
            "prior": self.prior.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        shape = {"gamma_max": self.gamma_max, "uppers": list(self.buckets.uppers)}
        if state["shape"] != shape:
            raise ValueError(f"saved bandit state has shape {state['shape']}, this policy {shape}")
        for bandit, s in zip(self.bandits, state["bandits"], strict=True):
            bandit.load_state_dict(s)
        self.draws = Draws.from_state(state["draws"])
        self.switch.load_state_dict(state["switch"])
        if self.chooser is not None and state["chooser"] is not None:
            self.chooser.load_state_dict(state["chooser"])
        if self.offload is not None and state["offload"] is not None:
            self.offload.load_state_dict(state["offload"])
        self.last_batch = [int(b) for b in state["last_batch"]]
        self.recent_batch = int(state.get("recent_batch", 1))
        self.transitions.load_state_dict(state["transitions"])
        if "prior" in state:
            self.prior.load_state_dict(state["prior"])
