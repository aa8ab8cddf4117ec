"""The regime verdict (benchmarks/load/verdict.py) on synthetic phase tables: phases count
equally, no harm per phase, the claim as a geometric mean against every static configuration,
the oracle and its room, and the open-loop TPOT / E2E p99 checks."""

from __future__ import annotations

import math

import pytest

from benchmarks.load.metrics import WHOLE_RUN, Dist, PhaseStats
from benchmarks.load.verdict import judge
from benchmarks.load.verdict_report import verdict_markdown

# 1 user chat -> 16 users mixed -> 1 user code (lengths differ: each phase counts equally anyway)
LAYOUT = (("chat_1u#0", 0.0, 40.0), ("mixed_16u#1", 40.0, 160.0), ("code_1u#2", 160.0, 200.0))


def stats(*tok_s: float, tpot: tuple[float, ...] = (0.05, 0.1, 0.05), e2e: tuple[float, float] = (1.0, 2.0)
          ) -> list[PhaseStats]:  # fmt: skip
    out = []
    for (label, start, end), tok, tp in zip(LAYOUT, tok_s, tpot, strict=True):
        p = PhaseStats(label, start, end)
        p.tok_s = tok
        p.tpot = Dist(10, tp, tp, tp)
        out.append(p)
    whole = PhaseStats(WHOLE_RUN, 0.0, 200.0)
    whole.e2e = Dist(10, e2e[0], e2e[1], e2e[0])
    whole.goodput_tok_s = sum(tok_s) / 3
    return [*out, whole]


# The table: speculation pays at 1 user, nothing pays at 16.
STATICS = {
    "no-spec": stats(16.8, 129.9, 18.3),
    "ngram-4": stats(19.2, 74.4, 22.7),
    "chat-4": stats(21.9, 54.0, 20.7),
    "code-4": stats(17.1, 52.3, 23.5),
}
NAMES = list(STATICS)


def run(target: list[PhaseStats]) -> dict[str, list[PhaseStats]]:
    return {**STATICS, "cost-model": stats(99, 999, 99), "nightjar": target}


def test_a_policy_that_matches_the_oracle_passes_and_each_phase_counts_equally() -> None:
    oracle = stats(21.9, 129.9, 23.5)
    v = judge(run(oracle), NAMES, "nightjar")
    assert [(c.label, c.best_static) for c in v.phases] == [
        ("chat_1u#0", "chat-4"), ("mixed_16u#1", "no-spec"), ("code_1u#2", "code-4")
    ]  # fmt: skip
    # against no-spec: (21.9/16.8 · 1 · 23.5/18.3)^(1/3), whatever the phases' lengths
    want = math.exp((math.log(21.9 / 16.8) + math.log(23.5 / 18.3)) / 3)
    assert v.geomean["no-spec"] == pytest.approx(want) and want > 1.10
    assert v.oracle_margin["no-spec"] == pytest.approx(want) and v.oracle_room == pytest.approx(want)
    assert "cost-model" not in [c.best_static for c in v.phases]  # adaptive rows are never the oracle
    assert v.holds, [(c.name, c.value) for c in v.checks]
    assert [c.name for c in v.checks][:3] == [f"no harm: {c.label} vs {c.best_static}" for c in v.phases]
    text = "\n".join(verdict_markdown(v))
    assert "**Verdict: the claim HOLDS**." in text and "(adaptive, not judged)" in text


def test_losing_one_phase_by_five_percent_fails_no_harm() -> None:
    v = judge(run(stats(21.9, 0.95 * 129.9, 23.5)), NAMES, "nightjar")
    failed = [c.name for c in v.checks if not c.ok]
    assert failed == ["no harm: mixed_16u#1 vs no-spec"] and not v.holds
    assert "not met: no harm: mixed_16u#1 vs no-spec" in "\n".join(verdict_markdown(v))


def test_the_claim_fails_against_a_static_it_does_not_beat_by_ten_percent() -> None:
    # No harm anywhere, but against no-spec only ~1.03 by the geomean.
    v = judge(run(stats(21.9 * 0.98, 129.9, 18.3)), NAMES, "nightjar")
    failed = [c.name for c in v.checks if not c.ok]
    assert "claim: geomean vs no-spec" in failed and not v.holds


def test_where_the_oracle_has_no_room_the_report_says_the_claim_is_out_of_reach() -> None:
    flat = {"no-spec": stats(40, 300, 40), "ngram-2": stats(41, 250, 39)}
    v = judge({**flat, "nightjar": stats(41, 300, 40)}, list(flat), "nightjar")
    assert v.oracle_room < 1.10 and not v.holds
    assert all(c.ok for c in v.checks if c.name.startswith("no harm"))
    assert "out of reach" in "\n".join(verdict_markdown(v))


def test_open_loop_compares_tpot_per_phase_and_whole_run_p99() -> None:
    statics = {
        "no-spec": stats(1, 1, 1, tpot=(0.060, 0.100, 0.060), e2e=(2.0, 9.0)),
        "ngram-4": stats(1, 1, 1, tpot=(0.050, 0.140, 0.050), e2e=(1.5, 10.0)),
    }
    good = judge({**statics, "nightjar": stats(1, 1, 1, tpot=(0.051, 0.102, 0.050), e2e=(1.4, 9.0))},
                 list(statics), "nightjar", mode="open")  # fmt: skip
    assert [(c.name, c.ok) for c in good.checks] == [
        ("TPOT: chat_1u#0 vs ngram-4", True),
        ("TPOT: mixed_16u#1 vs no-spec", True),
        ("TPOT: code_1u#2 vs ngram-4", True),
        ("E2E p99 vs best static (no-spec)", True),
    ]
    assert good.holds and "goodput" in "\n".join(verdict_markdown(good))
    bad = judge({**statics, "nightjar": stats(1, 1, 1, tpot=(0.051, 0.110, 0.050), e2e=(1.4, 9.5))},
                list(statics), "nightjar", mode="open")  # fmt: skip
    assert [c.name for c in bad.checks if not c.ok] == [
        "TPOT: mixed_16u#1 vs no-spec",
        "E2E p99 vs best static (no-spec)",
    ]


def test_missing_target_or_statics_cannot_be_judged() -> None:
    v = judge({"no-spec": stats(1, 1, 1)}, NAMES, "nightjar")
    assert v.missing and not v.holds and v.answer == "cannot be tested"
    assert "cannot be tested" in "\n".join(verdict_markdown(v))
    assert judge({"nightjar": stats(1, 1, 1)}, NAMES, "nightjar").missing == "no static configuration ran"
