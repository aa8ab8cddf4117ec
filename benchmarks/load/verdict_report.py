"""The verdict as markdown: the claim regime by regime, the ratio table r(C, p), the oracle
and its room, every check with its numbers, and the plain answer."""

from __future__ import annotations

from benchmarks.load.verdict import CLAIM, MOONSHOT, TPOT_TOLERANCE, Verdict


def _closed_claim(v: Verdict) -> list[str]:
    share = 1 - v.tolerance
    return [
        f"Claim (closed loop, each phase counts equally; r(C, p) = {v.target} tok/s ÷ C's in phase p): "
        f"a. no harm — {v.target} ≥ {share:.2f}× the best static configuration in every phase; "
        f"b. the claim — for every static configuration S the geometric mean over phases of r(S, p) "
        f"≥ {CLAIM:.2f} (moonshot {MOONSHOT:.2f}).",
    ]


def _ratio_table(v: Verdict) -> list[str]:
    head = "| config | " + " | ".join(f"r(C, {c.label})" for c in v.phases) + " | geomean |"
    lines = ["", head, "|---|" + "---|" * (len(v.phases) + 1)]
    for name, g in sorted(v.geomean.items(), key=lambda kv: kv[1]):
        mark = "" if name in v.statics else " (adaptive, not judged)"
        cells = " | ".join(f"{c.ratios.get(name, float('nan')):.3f}" for c in v.phases)
        lines.append(f"| {name}{mark} | {cells} | {g:.3f} |")
    lines += ["", f"| phase | oracle (best static) | its tok/s | {v.target} tok/s | {v.target} / oracle |",
              "|---|---|---|---|---|"]  # fmt: skip
    for c in v.phases:
        lines.append(
            f"| {c.label} | {c.best_static} | {c.best_tok_s:.1f} | {c.target_tok_s:.1f} | {c.ratio:.3f} |"
        )
    room = v.oracle_room
    lines += [
        "",
        "The oracle's geometric-mean margin over each static configuration: "
        + ", ".join(f"{s} {m:.3f}" for s, m in sorted(v.oracle_margin.items(), key=lambda kv: kv[1]))
        + f". The smallest, {room:.3f}×, is the most any switcher picking one static configuration per "
        + "phase shows on claim b"
        + (f": below {CLAIM:.2f}, so b is out of reach in this line-up." if room < CLAIM else "."),
    ]
    return lines


def _open_lines(v: Verdict) -> list[str]:
    lines = [
        f"Claim (open loop): c. in every phase {v.target}'s mean TPOT ≤ {1 + TPOT_TOLERANCE:.2f}× the lowest "
        "among the static configurations, and its whole-run E2E p99 ≤ the lowest among them.",
        "",
        "| config | "
        + " | ".join(f"TPOT ms {c.label}" for c in v.phases)
        + " | E2E p50 s | E2E p99 s | goodput |",
        "|---|" + "---|" * (len(v.phases) + 3),
    ]
    for name, (p50, p99) in v.latency.items():
        tpots = " | ".join("–" if t is None else f"{1000 * t:.1f}" for t in v.tpot.get(name, []))
        f50 = "–" if p50 is None else f"{p50:.2f}"
        f99 = "–" if p99 is None else f"{p99:.2f}"
        lines.append(f"| {name} | {tpots} | {f50} | {f99} | {v.goodput.get(name, 0.0):.1f} |")
    return lines


def verdict_markdown(v: Verdict) -> list[str]:
    """The claim, the ratio table, the oracle, every check, and the answer."""
    lines = _open_lines(v) if v.mode == "open" else _closed_claim(v)
    if v.missing:
        return [*lines, "", f"**Verdict: cannot be tested** — {v.missing}."]
    lines += _ratio_table(v)
    lines += ["", "| check | value | bound | numbers | met |", "|---|---|---|---|---|"]
    for c in v.checks:
        op = "≤" if c.at_most else "≥"
        met = "yes" if c.ok else "NO"
        lines.append(f"| {c.name} | {c.value:.3f} | {op} {c.bound:.2f} | {c.detail} | {met} |")
    failed = [c.name for c in v.checks if not c.ok]
    why = f" — not met: {'; '.join(failed)}" if failed else ""
    lines += ["", f"**Verdict: the claim {v.answer.upper()}**{why}."]
    return lines
