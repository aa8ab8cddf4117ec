"""The claim's verdict from per-phase numbers."""

from __future__ import annotations

from benchmarks.load.metrics import WHOLE_RUN, PhaseStats
from benchmarks.load.verdict import judge, verdict_markdown


def stats(low: float, high: float, whole: float) -> list[PhaseStats]:
    out = []
    for label, tok in (("low#0", low), ("high#1", high), (WHOLE_RUN, whole)):
        p = PhaseStats(label, 0.0, 1.0)
        p.tok_s = tok
        out.append(p)
    return out


STATICS = ["no-spec", "static-2"]


def test_claim_holds_within_tolerance_and_beating_every_static() -> None:
    v = judge({"no-spec": stats(10, 50, 30), "static-2": stats(12, 40, 29), "nightjar": stats(11.7, 50, 31)},
              STATICS, "nightjar")  # fmt: skip
    assert [(c.label, c.best_static, c.ok) for c in v.phases] == [
        ("low#0", "static-2", True),
        ("high#1", "no-spec", True),
    ]
    assert v.phases[0].ratio == 11.7 / 12
    assert [(r.static, r.ok) for r in v.whole_run] == [("no-spec", True), ("static-2", True)]
    assert v.holds
    assert "**Verdict: the claim HOLDS**." in verdict_markdown(v)


def test_claim_fails_when_a_phase_is_more_than_3_percent_behind() -> None:
    v = judge({"no-spec": stats(10, 50, 30), "static-2": stats(12, 40, 29), "nightjar": stats(11.6, 50, 31)},
              STATICS, "nightjar")  # fmt: skip
    assert not v.phases_ok and v.whole_run_ok and not v.holds
    text = "\n".join(verdict_markdown(v))
    assert "DOES NOT HOLD" in text and "low#0" in text


def test_claim_fails_on_a_whole_run_tie() -> None:
    v = judge({"no-spec": stats(10, 50, 30), "nightjar": stats(10, 50, 30)}, STATICS, "nightjar")
    assert v.phases_ok and not v.whole_run_ok
    assert "does not beat no-spec" in "\n".join(verdict_markdown(v))


def test_adaptive_configurations_are_not_compared_against() -> None:
    v = judge({"no-spec": stats(10, 50, 30), "threshold": stats(99, 99, 99), "nightjar": stats(10, 50, 31)},
              ["no-spec"], "nightjar")  # fmt: skip
    assert v.holds


def test_missing_target_or_statics_cannot_be_judged() -> None:
    v = judge({"no-spec": stats(1, 1, 1)}, STATICS, "nightjar")
    assert v.missing and not v.holds
    assert "cannot be tested" in "\n".join(verdict_markdown(v))
    assert judge({"nightjar": stats(1, 1, 1)}, STATICS, "nightjar").missing == "no static configuration ran"
