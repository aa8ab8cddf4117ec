"""The issue-13 verdict on synthetic results: holds, does not hold, the oracle, nothing pays,
and the open-loop latency claim."""

from __future__ import annotations

import pytest

from benchmarks.load.metrics import WHOLE_RUN, Dist, PhaseStats
from benchmarks.load.verdict import judge
from benchmarks.load.verdict_report import verdict_markdown

# Three phases of 60, 120 and 60 s: weights 0.25, 0.5, 0.25.
LAYOUT = (("chat_low#0", 0.0, 60.0), ("mixed_high#1", 60.0, 180.0), ("code_low#2", 180.0, 240.0))


def stats(*tok_s: float, e2e: tuple[float, float] = (1.0, 2.0)) -> list[PhaseStats]:
    out = []
    for (label, start, end), tok in zip(LAYOUT, tok_s, strict=True):
        p = PhaseStats(label, start, end)
        p.tok_s = tok
        out.append(p)
    whole = PhaseStats(WHOLE_RUN, 0.0, 240.0)
    whole.e2e = Dist(10, e2e[0], e2e[1], e2e[0])
    whole.goodput_tok_s = sum(tok_s) / 3
    return [*out, whole]


# The best static changes with the phase: prose drafter on chat, none at high load, code drafter on code.
STATICS = {
    "no-spec": stats(40, 300, 40),
    "prose-4": stats(60, 260, 45),
    "code-4": stats(45, 250, 70),
}
NAMES = list(STATICS)


def run(target: list[PhaseStats], **kw: object) -> dict[str, list[PhaseStats]]:
    return {**STATICS, "threshold": stats(99, 999, 99), "nightjar": target, **kw}  # type: ignore[dict-item]


def test_the_oracle_stitches_each_phase_best_static() -> None:
    v = judge(run(stats(59, 300, 69)), NAMES, "nightjar", no_spec=["no-spec"])
    assert [(c.label, c.best_static, c.weight) for c in v.phases] == [
        ("chat_low#0", "prose-4", 0.25),
        ("mixed_high#1", "no-spec", 0.5),
        ("code_low#2", "code-4", 0.25),
    ]
    assert v.oracle_tok_s == pytest.approx(0.25 * 60 + 0.5 * 300 + 0.25 * 70)
    # best single static over the weighted run: no-spec (170) against prose-4 (156) and code-4 (153.75)
    assert v.best_static == "no-spec" and v.run_tok_s["no-spec"] == pytest.approx(170.0)
    assert v.oracle_margin == pytest.approx(182.5 / 170.0)
    assert "threshold" not in [c.best_static for c in v.phases]  # adaptive rows are never the oracle
    assert not v.nothing_pays


def test_claim_holds() -> None:
    # 0.25·59 + 0.5·340 + 0.25·69 = 202 ≥ 1.10 × 170 and ≥ 0.90 × 182.5; every phase ≥ 0.97×.
    v = judge(run(stats(59, 340, 69)), NAMES, "nightjar", no_spec=["no-spec"])
    assert v.holds and v.answer == "holds", [(c.name, c.value, c.ok) for c in v.checks]
    names = [c.name for c in v.checks]
    assert names[:2] == ["run vs best static (no-spec)", "run vs oracle"]
    assert len(names) == 5
    text = "\n".join(verdict_markdown(v))
    assert "**Verdict: the claim HOLDS**." in text
    assert "weighted by their duration" in text and "chat_low#0 0.25" in text
    assert "| oracle (prose-4 → no-spec → code-4) | 182.5 | 1.074 | 1.000 |" in text
    assert "margin over the best single static configuration is 1.074×" in text


def test_claim_does_not_hold_when_the_run_gain_is_short() -> None:
    # Ties the oracle phase by phase: 182.5 < 1.10 × 170 = 187.
    v = judge(run(stats(60, 300, 70)), NAMES, "nightjar", no_spec=["no-spec"])
    failed = [c.name for c in v.checks if not c.ok]
    assert failed == ["run vs best static (no-spec)"] and not v.holds
    text = "\n".join(verdict_markdown(v))
    assert "DOES NOT HOLD" in text and "not met: run vs best static (no-spec)" in text
    assert "below the 1.10× the claim asks" in text


def test_claim_does_not_hold_when_a_phase_falls_behind() -> None:
    # A big win under load cannot buy a phase more than 3 % behind its best static.
    v = judge(run(stats(57, 400, 69)), NAMES, "nightjar", no_spec=["no-spec"])
    assert [c.name for c in v.checks if not c.ok] == ["chat_low#0 vs prose-4"]
    assert v.checks[0].ok and v.checks[1].ok and not v.holds


def test_claim_does_not_hold_below_the_oracle_share() -> None:
    v = judge(run(stats(59, 150, 69)), NAMES, "nightjar", no_spec=["no-spec"])
    assert {c.name for c in v.checks if not c.ok} >= {"run vs oracle", "mixed_high#1 vs no-spec"}


def test_nothing_pays_asks_for_no_harm_against_no_spec() -> None:
    flat = {"no-spec": stats(40, 300, 40), "ngram-2": stats(38, 250, 39)}
    ok = judge({**flat, "nightjar": stats(39, 295, 39.5)}, list(flat), "nightjar", no_spec=["no-spec"])
    assert ok.nothing_pays and ok.oracle_margin == pytest.approx(1.0)
    assert [c.name for c in ok.checks] == [f"{label} vs no-spec" for label, _, _ in LAYOUT]
    assert ok.holds
    assert "Nothing pays in this workload" in "\n".join(verdict_markdown(ok))
    bad = judge({**flat, "nightjar": stats(36, 300, 40)}, list(flat), "nightjar", no_spec=["no-spec"])
    assert bad.nothing_pays and not bad.holds
    assert [c.name for c in bad.checks if not c.ok] == ["chat_low#0 vs no-spec"]


def test_open_loop_compares_e2e_p50_and_p99_with_the_best_static() -> None:
    statics = {"no-spec": stats(1, 1, 1, e2e=(2.0, 9.0)), "ngram-4": stats(1, 1, 1, e2e=(1.5, 10.0))}
    good = judge({**statics, "nightjar": stats(1, 1, 1, e2e=(1.4, 9.0))}, list(statics), "nightjar",
                 mode="open")  # fmt: skip
    assert [(c.name, c.ok) for c in good.checks] == [
        ("E2E p50 vs best static (ngram-4)", True),
        ("E2E p99 vs best static (no-spec)", True),
    ]
    assert good.holds and "goodput" in "\n".join(verdict_markdown(good))
    bad = judge({**statics, "nightjar": stats(1, 1, 1, e2e=(1.4, 9.5))}, list(statics), "nightjar",
                mode="open")  # fmt: skip
    assert not bad.holds and "E2E p99" in "\n".join(verdict_markdown(bad))
    flat = judge({**statics, "nightjar": stats(1, 1, 1, e2e=(1.4, 9.0))}, list(statics), "nightjar",
                 mode="open", no_spec=["no-spec"])  # fmt: skip
    text = "\n".join(verdict_markdown(flat))
    assert flat.nothing_pays and "no harm" not in text and "about latency" in text


def test_missing_target_or_statics_cannot_be_judged() -> None:
    v = judge({"no-spec": stats(1, 1, 1)}, NAMES, "nightjar")
    assert v.missing and not v.holds and v.answer == "cannot be tested"
    assert "cannot be tested" in "\n".join(verdict_markdown(v))
    assert judge({"nightjar": stats(1, 1, 1)}, NAMES, "nightjar").missing == "no static configuration ran"
