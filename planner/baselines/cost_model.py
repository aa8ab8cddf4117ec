"""``cost-model``: RAKV-ASD's measured cost model, with k = 0 a first-class draft length."""

from __future__ import annotations

from typing import Any, ClassVar

from planner.baselines.costs import MeasuredCosts
from planner.policies.base import Choice, Policy
from planner.policies.buckets import Buckets
from planner.policies.offload import OFFLOAD_PARAMS, OffloadRule
from planner.policies.prior import ProfilePrior
from planner.policies.signals import acceptance, is_step
from shared.control import Telemetry
from shared.experts import expected_tokens
from shared.policy_params import Param, bool_param, float_param, int_list_param, int_param, str_param
from shared.profile import CostProfile

LENGTHS = (0, 1, 2, 4, 6, 8)


class CostModelPolicy(Policy):
    """Per batch-size bucket, the draft length k ∈ {0,1,2,4,6,8} (≤ gamma_max) with the lowest
    expected time per token, (k·t_d + t_v(k)) / E_k(α̂), where t_v(k) is the measured time of a
    step that verifies k drafts (k = 0: a plain decode step), t_d one measured draft step,
    and α̂ an EWMA of the acceptance rate. Unmeasured costs come from priors relative to the
    measured plain step (see costs.MeasuredCosts); every ``probe_every`` steps of a bucket
    one decision runs its stalest k instead, so measurements and α̂ never freeze (a policy
    that stops speculating otherwise never measures acceptance again). Optionally offloads
    like nightjar. Given a startup cost profile (``use_profile``), unmeasured costs come from
    it instead (scaled by the bucket's measured/profiled ratio), and a probe runs only a k
    whose predicted interval (prior.py) still overlaps the best k's.
    """

    PARAMS: ClassVar[dict[str, Param]] = {
        "gamma_max": int_param(8, "largest draft length considered", 1, 16),
        "buckets": int_list_param("pow2", "batch-size buckets: pow2, pairs, or bounds", ("pow2", "pairs")),
        "beta": float_param(0.1, "EWMA weight of the newest acceptance / time sample", 0.001, 1.0),
        "alpha_prior": float_param(0.6, "acceptance assumed before any is measured", 0.0, 0.99),
        "draft_ratio": float_param(0.1, "prior: draft step time / plain step time", 0.0),
        "verify_slope": float_param(0.2, "prior: extra verify time per draft token / plain step", 0.0),
        "probe_every": int_param(100, "steps of a bucket between probes of its stalest k (0: never)", 0),
        "drafter": str_param(None, "drafter to use (None: the worker's default)"),
        "prior": bool_param(True, "use a published cost profile as the prior (False: ignore it)"),
        "offload": bool_param(False, "offload the draft under memory pressure (see offload_*)"),
        **OFFLOAD_PARAMS,
    }

    def __init__(self, **params: Any) -> None:
        p = {k: spec.default for k, spec in self.PARAMS.items()} | params
        super().__init__(**p)
        self.lengths = [k for k in LENGTHS if k <= p["gamma_max"]]
        self.buckets = Buckets(p["buckets"])
        self.beta: float = p["beta"]
        self.alpha: float = p["alpha_prior"]
        self.drafter: str | None = p["drafter"]
        self.costs = MeasuredCosts(len(self.buckets), self.beta, p["draft_ratio"], p["verify_slope"])
        self.offload = OffloadRule(**{k: p[k] for k in OFFLOAD_PARAMS}) if p["offload"] else None
        self.probe_every: int = p["probe_every"]
        self.since_probe = [0] * len(self.buckets)
        self.use_prior: bool = p["prior"]
        self.prior = ProfilePrior()
        self.probes = 0  # probes that ran another length than the best (not state)

    def use_profile(self, profile: CostProfile) -> None:
        if self.use_prior:
            self.prior.use(profile)

    def observe(self, t: Telemetry) -> None:
        if self.offload is not None:
            self.offload.observe(t)
        if not is_step(t):
            return
        bucket = self.buckets.index(t.batch_size)
        self.costs.add(bucket, t)
        self.since_probe[bucket] += 1
        self.prior.observe(t)
        a = acceptance(t)
        if a is None and t.counterfactual:  # k = 0 ran: the workers may still score the drafter
            name = self.drafter or t.drafter
            a = t.counterfactual.get(name) if name else None
        if a is not None:
            self.alpha += self.beta * (a - self.alpha)

    def _scale(self, bucket: int, batch: int) -> float:
        """Measured / profiled step time over the lengths measured in ``bucket`` (1: none)."""
        p = self.prior.profile
        assert p is not None
        ctx = self.prior.context
        tv = self.costs.tv[bucket]
        pairs = [(v, p.target(batch, k + 1, ctx)) for k, v in enumerate(tv) if v is not None]
        return sum(v for v, _ in pairs) / sum(x for _, x in pairs) if pairs else 1.0

    def cost_per_token(self, bucket: int, k: int) -> float:
        p = self.prior.profile
        if p is None or k + 1 > p.rows[-1]:
            t_v, t_d = self.costs.verify(bucket, k), self.costs.draft(bucket)
        else:  # from the profile where nothing was measured
            batch, scale = self.buckets.representative(bucket), 1.0
            measured = self.costs.tv[bucket][k]
            scale = self._scale(bucket, batch) if measured is None else 1.0
            t_v = measured if measured is not None else scale * p.target(batch, k + 1, self.prior.context)
            td = self.costs.td[bucket]
            t_d = td if td is not None else p.draft(batch, self.drafter)
        return (k * t_d + t_v) / expected_tokens(self.alpha, k)

    def uncertain(self, bucket: int, best: int) -> list[int]:
        """The lengths whose predicted interval overlaps the best one's (all: no profile)."""
        if self.prior.profile is None:
            return self.lengths
        batch = self.buckets.representative(bucket)
        scale = self._scale(bucket, batch)
        preds = {k: self.prior.predict(batch, k, self.drafter) for k in self.lengths}
        top = preds[best]
        if top is None:
            return self.lengths
        return [
            k
            for k, iv in preds.items()
            if k == best or iv is None or not top.scaled(scale).beats(iv.scaled(scale))
        ]

    def best_length(self, bucket: int) -> int:
        return min(self.lengths, key=lambda k: (self.cost_per_token(bucket, k), k))

    def length(self, bucket: int) -> int:
        """The cheapest k, except once every ``probe_every`` steps: the stalest k, measured again."""
        best = self.best_length(bucket)
        if self.probe_every and self.since_probe[bucket] >= self.probe_every:
            self.since_probe[bucket] = 0
            k = self.costs.stalest(bucket, self.uncertain(bucket, best))
            self.probes += int(k != best)
            return k
        return best

    def decide(self, now: float) -> Choice:
        offload = self.offload.decide() if self.offload is not None else False
        gammas = [0 if offload else self.length(i) for i in range(len(self.buckets))]
        return Choice(
            gamma_table=self.buckets.table(gammas),
            drafter=self.drafter,
            offload=offload,
            note=f"cost-model α̂={self.alpha:.2f} k={gammas}" + (" offload" if offload else ""),
        )

    def state_dict(self) -> dict[str, Any]:
        return {
            "alpha": self.alpha,
            "since_probe": list(self.since_probe),
            "costs": self.costs.state_dict(),
            "prior": self.prior.state_dict(),
            "offload": self.offload.state_dict() if self.offload is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.alpha = float(state["alpha"])
        self.since_probe = [int(x) for x in state["since_probe"]]
        self.costs.load_state_dict(state["costs"])
        if "prior" in state:
            self.prior.load_state_dict(state["prior"])
        if self.offload is not None and state["offload"] is not None:
            self.offload.load_state_dict(state["offload"])
