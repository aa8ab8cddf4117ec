"""The claim under test, answered from the measurements (issue 13).

Closed loop (N users per phase; tokens/s is capacity), phases weighted by their duration
(a configuration's run figure is Σ d_p · tok/s_p / Σ d_p):

- over the run the target serves ≥ 1.10 × the best single static configuration,
- and ≥ 0.90 × the oracle: the best static configuration of each phase stitched together
  (Σ d_p · max_s tok/s_{s,p} / Σ d_p), the ceiling of any switcher that picks one static
  configuration per phase; the oracle's margin over the best static is the room there is,
- and in every phase ≥ 0.97 × that phase's best static configuration.

Where nothing pays (a γ = 0 configuration is the best static one in every phase), the claim
is "no harm" instead: the target ≥ 0.97 × no-spec in every phase; the run figures are shown.

Open loop (Poisson arrivals): the target's end-to-end latency p50 and p99 over the run are no
worse than the best static configuration's (the lowest p50 and the lowest p99 among them,
each compared with its own best); goodput under the SLO is reported beside them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from benchmarks.load.metrics import WHOLE_RUN, PhaseStats

RUN_GAIN = 1.10  # target / best static over the run, at least
ORACLE_SHARE = 0.90  # target / oracle over the run, at least
TOLERANCE = 0.03  # per phase: target ≥ (1 − TOLERANCE) × the best static
LATENCY_TOLERANCE = 0.0  # open loop: target p50/p99 ≤ (1 + this) × the best static's


@dataclass
class Check:
    """One criterion: ``value`` compared with ``bound`` (≥, or ≤ when ``at_most``)."""

    name: str
    value: float
    bound: float
    detail: str = ""
    at_most: bool = False

    @property
    def ok(self) -> bool:
        return self.value <= self.bound if self.at_most else self.value >= self.bound


@dataclass
class PhaseBest:
    label: str
    weight: float
    best_static: str
    best_tok_s: float
    target_tok_s: float

    @property
    def ratio(self) -> float:
        return self.target_tok_s / self.best_tok_s if self.best_tok_s > 0 else float("inf")


@dataclass
class Verdict:
    target: str
    mode: str  # "closed" or "open"
    tolerance: float = TOLERANCE
    phases: list[PhaseBest] = field(default_factory=list)
    run_tok_s: dict[str, float] = field(default_factory=dict)  # duration-weighted, per config
    oracle_tok_s: float = 0.0
    best_static: str = ""
    nothing_pays: bool = False
    no_spec: str | None = None
    checks: list[Check] = field(default_factory=list)
    latency: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)  # E2E p50, p99
    goodput: dict[str, float] = field(default_factory=dict)  # whole-run goodput tok/s
    missing: str | None = None  # why the claim cannot be tested

    @property
    def oracle_margin(self) -> float:
        best = self.run_tok_s.get(self.best_static, 0.0)
        return self.oracle_tok_s / best if best > 0 else float("inf")

    @property
    def holds(self) -> bool:
        return self.missing is None and bool(self.checks) and all(c.ok for c in self.checks)

    @property
    def answer(self) -> str:
        if self.missing:
            return "cannot be tested"
        return "holds" if self.holds else "does not hold"


def weighted(stats: list[PhaseStats], weights: dict[str, float]) -> float:
    """Σ w_p · tok/s_p over the phases (``weights`` sum to one)."""
    return sum(weights.get(p.label, 0.0) * p.tok_s for p in stats if p.label != WHOLE_RUN)


def _whole(stats: list[PhaseStats]) -> PhaseStats:
    return next(p for p in stats if p.label == WHOLE_RUN)


def judge(
    stats: dict[str, list[PhaseStats]],
    statics: list[str],
    target: str,
    tolerance: float = TOLERANCE,
    *,
    mode: str = "closed",
    no_spec: list[str] | None = None,
    latency_tolerance: float = LATENCY_TOLERANCE,
) -> Verdict:
    """``stats``: configuration -> its PhaseStats (phases in order, then the whole run);
    ``statics``: the fixed configurations; ``no_spec``: those of them that never speculate."""
    v = Verdict(target, mode, tolerance)
    present = [s for s in statics if s in stats and s != target]
    if target not in stats:
        v.missing = f"the target configuration {target!r} did not run"
        return v
    if not present:
        v.missing = "no static configuration ran"
        return v
    phases = [p for p in stats[target] if p.label != WHOLE_RUN]
    total = sum(p.end_s - p.start_s for p in phases)
    weights = {p.label: (p.end_s - p.start_s) / total if total > 0 else 1 / len(phases) for p in phases}
    by_label = {name: {p.label: p for p in stats[name]} for name in stats}
    v.run_tok_s = {name: weighted(s, weights) for name, s in stats.items()}
    v.latency = {name: (_whole(s).e2e.p50, _whole(s).e2e.p99) for name, s in stats.items()}
    v.goodput = {name: _whole(s).goodput_tok_s for name, s in stats.items()}
    for p in phases:
        best = max(present, key=lambda s: by_label[s][p.label].tok_s)
        v.phases.append(PhaseBest(p.label, weights[p.label], best, by_label[best][p.label].tok_s, p.tok_s))
    v.oracle_tok_s = sum(c.weight * c.best_tok_s for c in v.phases)
    v.best_static = max(present, key=lambda s: v.run_tok_s[s])
    zero = [s for s in (no_spec or []) if s in present]
    v.no_spec = zero[0] if zero else None
    v.nothing_pays = bool(zero) and all(c.best_static in zero for c in v.phases)
    if mode == "open":
        v.checks = _open_checks(v, present, latency_tolerance)
    else:
        v.checks = _closed_checks(v, by_label)
    return v


def _closed_checks(v: Verdict, by_label: dict[str, dict[str, PhaseStats]]) -> list[Check]:
    share = 1.0 - v.tolerance
    out: list[Check] = []
    if v.nothing_pays and v.no_spec is not None:
        base = by_label[v.no_spec]
        for c in v.phases:
            theirs = base[c.label].tok_s
            detail = f"{c.target_tok_s:.1f} / {theirs:.1f} tok/s"
            out.append(Check(f"{c.label} vs {v.no_spec}", _ratio(c.target_tok_s, theirs), share, detail))
        return out
    target, best = v.run_tok_s[v.target], v.run_tok_s[v.best_static]
    out += [
        Check(f"run vs best static ({v.best_static})", _ratio(target, best), RUN_GAIN,
              f"{target:.1f} / {best:.1f} tok/s"),
        Check("run vs oracle", _ratio(target, v.oracle_tok_s), ORACLE_SHARE,
              f"{target:.1f} / {v.oracle_tok_s:.1f} tok/s"),
    ]  # fmt: skip
    out += [Check(f"{c.label} vs {c.best_static}", c.ratio, share,
                  f"{c.target_tok_s:.1f} / {c.best_tok_s:.1f} tok/s") for c in v.phases]  # fmt: skip
    return out


def _open_checks(v: Verdict, present: list[str], tol: float) -> list[Check]:
    out: list[Check] = []
    for i, what in ((0, "p50"), (1, "p99")):
        known = [s for s in present if v.latency[s][i] is not None]
        mine = v.latency[v.target][i]
        if not known or mine is None:
            v.missing = f"no E2E {what} to compare (no request completed)"
            return []
        best = min(known, key=lambda s: v.latency[s][i] or 0.0)
        theirs = v.latency[best][i] or 0.0
        out.append(Check(f"E2E {what} vs best static ({best})", _ratio(mine, theirs), 1.0 + tol,
                         f"{mine:.2f} / {theirs:.2f} s", at_most=True))  # fmt: skip
    return out


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("inf")
