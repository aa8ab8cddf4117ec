"""The verdict as markdown: what the claim says, how phases are weighted, the oracle and its
margin, every check with its numbers, and the plain answer."""

from __future__ import annotations

from benchmarks.load.verdict import ORACLE_SHARE, RUN_GAIN, Verdict


def _closed_claim(v: Verdict) -> list[str]:
    share = 1 - v.tolerance
    return [
        f'Claim (closed loop): "over the run {v.target} serves ≥ {RUN_GAIN:.2f}× the best single static '
        f"configuration and ≥ {ORACLE_SHARE:.2f}× the oracle, and ≥ {share:.2f}× the best static "
        'configuration in every phase" (output tokens/s at a fixed number of users).',
        "",
        "Phases are weighted by their duration: a run figure is Σ d_p · tok/s_p / Σ d_p, with weights "
        + ", ".join(f"{c.label} {c.weight:.2f}" for c in v.phases)
        + ". The oracle runs each phase's best static configuration (stitched from the measured phases):",
        "the ceiling of any switcher that picks one static configuration per phase.",
    ]


def _oracle_table(v: Verdict) -> list[str]:
    lines = ["", f"| phase | weight | best static | its tok/s | {v.target} tok/s | ratio |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for c in v.phases:
        lines.append(f"| {c.label} | {c.weight:.2f} | {c.best_static} | {c.best_tok_s:.1f} "
                     f"| {c.target_tok_s:.1f} | {c.ratio:.3f} |")  # fmt: skip
    best = v.run_tok_s.get(v.best_static, 0.0)
    lines += [
        "",
        "| whole run (weighted) | tok/s | vs best static | vs oracle |",
        "|---|---|---|---|",
        f"| oracle ({' → '.join(c.best_static for c in v.phases)}) | {v.oracle_tok_s:.1f} "
        f"| {v.oracle_margin:.3f} | 1.000 |",
    ]
    for name, tok in sorted(v.run_tok_s.items(), key=lambda kv: -kv[1]):
        vs_best = tok / best if best > 0 else float("inf")
        vs_oracle = tok / v.oracle_tok_s if v.oracle_tok_s > 0 else float("inf")
        mark = " (best static)" if name == v.best_static else ""
        lines.append(f"| {name}{mark} | {tok:.1f} | {vs_best:.3f} | {vs_oracle:.3f} |")
    lines += [
        "",
        f"The oracle's margin over the best single static configuration is {v.oracle_margin:.3f}×: "
        + (
            f"the room any phase-level switcher has. It is below the {RUN_GAIN:.2f}× the claim asks, so "
            f"{v.target} can meet that bound only by beating every per-phase static choice."
            if v.oracle_margin < RUN_GAIN
            else "the room any phase-level switcher has."
        ),
    ]
    return lines


def _open_lines(v: Verdict) -> list[str]:
    lines = [
        f"Claim (open loop): \"{v.target}'s end-to-end latency p50 and p99 over the run are no worse than "
        "the best static configuration's\" (each against the lowest among the static configurations).",
        "",
        "| config | E2E p50 s | E2E p99 s | goodput tok/s (SLO) |",
        "|---|---|---|---|",
    ]
    for name, (p50, p99) in v.latency.items():
        f50 = "–" if p50 is None else f"{p50:.2f}"
        f99 = "–" if p99 is None else f"{p99:.2f}"
        lines.append(f"| {name} | {f50} | {f99} | {v.goodput.get(name, 0.0):.1f} |")
    return lines


def verdict_markdown(v: Verdict) -> list[str]:
    """The claim, the weighting, the oracle, every check, and the answer."""
    lines = _open_lines(v) if v.mode == "open" else _closed_claim(v)
    if v.missing:
        return [*lines, "", f"**Verdict: cannot be tested** — {v.missing}."]
    if v.mode != "open":
        lines += _oracle_table(v)
    if v.nothing_pays and v.mode != "open":
        lines += ["", f"Nothing pays in this workload: {v.no_spec} (γ = 0) is the best static configuration "
                  f"in every phase, so the claim under test is no harm: {v.target} ≥ "
                  f"{1 - v.tolerance:.2f}× {v.no_spec} in every phase."]  # fmt: skip
    elif v.nothing_pays:
        lines += ["", f"Nothing pays in this workload ({v.no_spec}, γ = 0, serves the most tokens in every "
                  "phase); the open-loop claim is about latency all the same."]  # fmt: skip
    lines += ["", "| check | value | bound | numbers | met |", "|---|---|---|---|---|"]
    for c in v.checks:
        op = "≤" if c.at_most else "≥"
        met = "yes" if c.ok else "NO"
        lines.append(f"| {c.name} | {c.value:.3f} | {op} {c.bound:.2f} | {c.detail} | {met} |")
    failed = [c.name for c in v.checks if not c.ok]
    why = f" — not met: {'; '.join(failed)}" if failed else ""
    lines += ["", f"**Verdict: the claim {v.answer.upper()}**{why}."]
    return lines
