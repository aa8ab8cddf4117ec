"""Metrics from synthetic request records and telemetry: percentiles, per-phase aggregation."""

from __future__ import annotations

import pytest

from benchmarks.load.client import RequestRecord
from benchmarks.load.metrics import WHOLE_RUN, config_stats, dist, tokens_in
from benchmarks.load.phases import parse_phases, windows
from shared.control import Decision, Telemetry

T0_WALL = 1_000_000.0


def rec(index: int, window: int, sent: float, chunks: list[float], tokens: int, end: float | None = None,
        error: str | None = None) -> RequestRecord:  # fmt: skip
    r = RequestRecord(
        index, window, sent, tokens, sent_s=sent, chunk_s=list(chunks), completion_tokens=tokens
    )
    r.first_token_s = chunks[0] if chunks else None
    r.end_s = (chunks[-1] if chunks else sent) if end is None and error is None else end
    r.error = error
    return r


def step(t: float, **kw: object) -> Telemetry:
    return Telemetry(worker_id="w", ts=T0_WALL + t, **kw)  # type: ignore[arg-type]


def test_dist_uses_linear_interpolation() -> None:
    d = dist([float(x) for x in range(1, 101)])
    assert (d.n, d.p50, d.mean) == (100, 50.5, 50.5)
    assert d.p99 == pytest.approx(99.01)
    assert dist([]).p50 is None


def test_request_latencies() -> None:
    r = rec(0, 0, 1.0, [1.5, 2.0, 2.5], tokens=5)
    assert r.ttft == pytest.approx(0.5)
    assert r.e2e == pytest.approx(1.5)
    assert r.tpot == pytest.approx(1.0 / 4)  # the decode span over the 4 tokens after the first


def test_tokens_are_spread_over_chunks_and_counted_in_windows() -> None:
    records = [rec(0, 0, 0.0, [1.0, 2.0, 3.0, 4.0], tokens=8), rec(1, 0, 0.0, [], 0, error="HTTP 500")]
    assert tokens_in(records, 0.0, 2.5) == pytest.approx(4.0)
    assert tokens_in(records, 2.5, 10.0) == pytest.approx(4.0)


def test_a_backlog_is_charged_to_the_phase_that_made_it() -> None:
    ws = windows(parse_phases("high:5:10,low:1:10"))
    slow = [rec(0, 0, 1.0, [2.0, 18.0], tokens=10), rec(1, 1, 12.0, [19.0, 20.0], tokens=2)]
    fast = [rec(0, 0, 1.0, [2.0, 5.0], tokens=10), rec(1, 1, 12.0, [13.0, 14.0], tokens=2)]
    (s_high, s_low, _), (f_high, f_low, _) = (config_stats(r, [], [], T0_WALL, ws) for r in (slow, fast))
    assert s_high.tok_s == pytest.approx(10 / 18) and f_high.tok_s == pytest.approx(10 / 10)
    assert s_low.tok_s == pytest.approx(2 / 10) == f_low.tok_s  # the slow one's backlog is not low's speed
    assert s_low.output_tokens > f_low.output_tokens


def test_config_stats_per_phase_and_whole_run() -> None:
    ws = windows(parse_phases("low:1:10,high:5:10"))
    records = [
        rec(0, 0, 1.0, [2.0, 3.0], tokens=4),  # arrived in low, all tokens in low
        rec(1, 1, 11.0, [12.0, 19.0, 21.0, 25.0], tokens=8),  # arrived in high, half streamed after it
        rec(2, 1, 12.0, [], 0, error="timeout"),
    ]
    telemetry = [
        step(2.0, batch_size=1, num_tokens=2, gamma=0),
        step(3.0, batch_size=0),  # an idle heartbeat is no step
        step(12.0, batch_size=2, num_tokens=6, gamma=4, drafter="d1", proposed=8, accepted=6,
             free_blocks=25, total_blocks=100, decision_version=1),
        step(13.0, batch_size=2, num_tokens=3, gamma=2, drafter="d2", proposed=4, accepted=0,
             free_blocks=75, total_blocks=100, draft_resident=False, decision_version=2),
    ]  # fmt: skip
    decisions = [Decision(version=1, policy="p", gamma_table=[(1, 4), (8, 3)]),
                 Decision(version=2, policy="p", gamma_table=[(1 << 30, 1)])]  # fmt: skip
    low, high, whole = config_stats(records, telemetry, decisions, T0_WALL, ws)
    assert (low.label, low.requests, low.completed, low.errors) == ("low#0", 1, 1, 0)
    assert low.output_tokens == pytest.approx(4.0)
    assert low.tok_s == pytest.approx(0.4)
    assert low.ttft.p50 == pytest.approx(1.0)
    assert low.server_tok_s == pytest.approx(0.2)
    assert low.mean_gamma == 0.0 and low.acceptance is None
    assert (high.requests, high.completed, high.errors) == (2, 1, 1)
    assert high.output_tokens == pytest.approx(4.0)  # 2 of the 4 chunks arrived before 20 s
    assert high.cohort_tokens == 8 and high.tok_s == pytest.approx(8 / 15)  # served by 25 s, from 10 s
    assert high.e2e.p50 == pytest.approx(14.0)
    assert (high.proposed, high.accepted) == (12, 6)
    assert high.acceptance == pytest.approx(0.5)
    assert high.mean_gamma == pytest.approx(3.0)
    assert high.decided_gamma == pytest.approx(2.0)  # (3 for batch 2 under v1) + (1 under v2)
    assert low.decided_gamma is None  # its step ran under no known decision
    assert high.gamma_share == {2: 0.5, 4: 0.5}
    assert high.drafter_share == {"d1": 0.5, "d2": 0.5}
    assert high.offloaded_share == pytest.approx(0.5)
    assert (high.kv_mean, high.kv_max) == (pytest.approx(0.5), pytest.approx(0.75))
    assert whole.label == WHOLE_RUN
    assert (whole.start_s, whole.end_s) == (0.0, 25.0)  # to the last [DONE]
    assert whole.output_tokens == pytest.approx(12.0)
    assert whole.tok_s == pytest.approx(12.0 / 25.0)
    assert (whole.requests, whole.completed) == (3, 2)


def test_closed_loop_capacity_and_goodput_under_the_slo() -> None:
    from benchmarks.load.metrics import Slo, parse_slo

    ws = windows(parse_phases("a:2u:10"))
    fast = rec(0, 0, 0.0, [0.5, 1.0, 1.5, 2.0], tokens=4)  # TTFT 0.5 s, TPOT 0.5 s
    slow = rec(1, 0, 0.0, [5.0, 8.0, 11.0, 14.0], tokens=4)  # TTFT 5 s; half its tokens after the window
    slo = parse_slo("ttft=1,tpot=0.6")
    assert slo == Slo(1.0, 0.6) and "TTFT ≤ 1 s" in slo.describe()
    capacity = config_stats([fast, slow], [], [], T0_WALL, ws, slo, capacity=True)[0]
    assert capacity.tok_s == pytest.approx(6 / 10)  # the tokens streamed inside [0, 10) over 10 s
    assert capacity.goodput_tok_s == pytest.approx(4 / 10) and capacity.slo_met == 1
    cohort = config_stats([fast, slow], [], [], T0_WALL, ws, slo)[0]
    assert cohort.tok_s == pytest.approx(8 / 14)  # open loop: the cohort, to its last response
    with pytest.raises(ValueError):
        parse_slo("ttft=0")
    with pytest.raises(ValueError):
        parse_slo("e2e=3")
