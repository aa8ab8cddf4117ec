"""The claim under test, answered from the measurements:

    "nightjar is within 3% of the best static configuration in every phase, and beats
    every static configuration over the whole run"

Per phase: the target's output tokens/s ≥ (1 − tolerance) × the best static configuration's
in that phase. Whole run: the target's tokens/s (all tokens over the makespan) is strictly
higher than each static configuration's. Both must hold for the claim to hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from benchmarks.load.metrics import WHOLE_RUN, PhaseStats

TOLERANCE = 0.03


@dataclass
class PhaseCheck:
    label: str
    target_tok_s: float
    best_static: str
    best_static_tok_s: float
    ok: bool

    @property
    def ratio(self) -> float:
        return self.target_tok_s / self.best_static_tok_s if self.best_static_tok_s > 0 else float("inf")


@dataclass
class RunCheck:
    static: str
    static_tok_s: float
    target_tok_s: float
    ok: bool

    @property
    def ratio(self) -> float:
        return self.target_tok_s / self.static_tok_s if self.static_tok_s > 0 else float("inf")


@dataclass
class Verdict:
    target: str
    tolerance: float
    phases: list[PhaseCheck] = field(default_factory=list)
    whole_run: list[RunCheck] = field(default_factory=list)
    missing: str | None = None  # why the claim cannot be tested (no target, no static)

    @property
    def phases_ok(self) -> bool:
        return self.missing is None and all(c.ok for c in self.phases)

    @property
    def whole_run_ok(self) -> bool:
        return self.missing is None and all(c.ok for c in self.whole_run)

    @property
    def holds(self) -> bool:
        return self.phases_ok and self.whole_run_ok


def judge(
    stats: dict[str, list[PhaseStats]], statics: list[str], target: str, tolerance: float = TOLERANCE
) -> Verdict:
    """``stats``: configuration name -> its PhaseStats (phases in order, then the whole run)."""
    v = Verdict(target, tolerance)
    present = [s for s in statics if s in stats and s != target]
    if target not in stats:
        v.missing = f"the target configuration {target!r} did not run"
        return v
    if not present:
        v.missing = "no static configuration ran"
        return v
    by_label = {name: {p.label: p for p in stats[name]} for name in [target, *present]}
    for p in stats[target]:
        if p.label == WHOLE_RUN:
            continue
        best = max(present, key=lambda s: by_label[s][p.label].tok_s)
        best_tok = by_label[best][p.label].tok_s
        v.phases.append(PhaseCheck(p.label, p.tok_s, best, best_tok, p.tok_s >= (1 - tolerance) * best_tok))
    target_all = by_label[target][WHOLE_RUN].tok_s
    for s in present:
        other = by_label[s][WHOLE_RUN].tok_s
        v.whole_run.append(RunCheck(s, other, target_all, target_all > other))
    return v


def verdict_markdown(v: Verdict) -> list[str]:
    """The claim, the per-phase and whole-run comparisons, and the answer."""
    pct = f"{v.tolerance:.0%}"
    lines = [
        f'Claim: "{v.target} is within {pct} of the best static configuration in every phase, '
        'and beats every static configuration over the whole run" (output tokens/s).',
        "",
    ]
    if v.missing:
        return [*lines, f"**Verdict: cannot be tested** — {v.missing}."]
    lines += [f"| phase | {v.target} tok/s | best static | its tok/s | ratio | within {pct} |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for c in v.phases:
        lines.append(f"| {c.label} | {c.target_tok_s:.1f} | {c.best_static} | {c.best_static_tok_s:.1f} "
                     f"| {c.ratio:.3f} | {'yes' if c.ok else 'NO'} |")  # fmt: skip
    lines += [
        "",
        f"| whole run: static | its tok/s | {v.target} tok/s | ratio | beaten |",
        "|---|---|---|---|---|",
    ]
    for r in v.whole_run:
        lines.append(f"| {r.static} | {r.static_tok_s:.1f} | {r.target_tok_s:.1f} | {r.ratio:.3f} "
                     f"| {'yes' if r.ok else 'NO'} |")  # fmt: skip
    failed = [c.label for c in v.phases if not c.ok]
    unbeaten = [r.static for r in v.whole_run if not r.ok]
    answer = "HOLDS" if v.holds else "DOES NOT HOLD"
    why = []
    if failed:
        why.append(f"more than {pct} behind the best static in {', '.join(failed)}")
    if unbeaten:
        why.append(f"does not beat {', '.join(unbeaten)} over the whole run")
    lines += [
        "",
        f"**Verdict: the claim {answer}**" + (f" — {v.target} " + "; ".join(why) if why else "") + ".",
    ]
    return lines
