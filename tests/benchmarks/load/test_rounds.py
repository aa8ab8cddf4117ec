"""Rounds of the line-up (benchmarks/load/rounds.py): alternating order, median round per cell."""

from __future__ import annotations

from typing import Any, cast

import pytest

from benchmarks.load.configs import BenchConfig
from benchmarks.load.metrics import PhaseStats
from benchmarks.load.results import ConfigRun
from benchmarks.load.rounds import median_run, order


def _run(name: str, tok_s: list[float], wall: float = 0.0) -> ConfigRun:
    stats = [PhaseStats(label=f"p{i}", start_s=0.0, end_s=1.0, tok_s=x) for i, x in enumerate(tok_s)]
    return ConfigRun(BenchConfig(name, "static"), 0.0, wall, [], [], [], stats, cast(Any, None))


def test_every_other_round_runs_the_line_up_in_reverse() -> None:
    abc = ["a", "b", "c"]
    assert [order(abc, r) for r in range(3)] == [abc, ["c", "b", "a"], abc]


def test_each_cell_takes_its_median_round_and_keeps_every_round() -> None:
    rounds = [_run("a", [100.0, 900.0, 500.0], 1.0), _run("a", [300.0, 700.0, 400.0], 2.0),
              _run("a", [200.0, 800.0, 450.0], 3.0)]  # fmt: skip
    merged = median_run(rounds)
    assert [p.tok_s for p in merged.stats] == [200.0, 800.0, 450.0]
    assert merged.wall_s == 3.0  # the whole-run row's median round gives records and plots
    assert merged.round_tok_s == [[100.0, 300.0, 200.0], [900.0, 700.0, 800.0], [500.0, 400.0, 450.0]]
    two = median_run(rounds[:2])  # an even count: the lower median
    assert [p.tok_s for p in two.stats] == [100.0, 700.0, 400.0]
    assert median_run(rounds[:1]) is rounds[0]


def test_run_configs_runs_rounds_in_alternating_order(monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks.load import runner
    from benchmarks.load.phases import parse_phases
    from benchmarks.load.trio import TrioOptions

    ran: list[str] = []

    async def fake_run_config(cfg: BenchConfig, *_: object) -> ConfigRun:
        ran.append(cfg.name)
        return _run(cfg.name, [float(len(ran))])

    monkeypatch.setattr(runner, "run_config", fake_run_config)
    settings = runner.RunSettings(parse_phases("a:1:1"), TrioOptions("unused"))
    configs = [BenchConfig("a", "static"), BenchConfig("b", "static")]
    runs, notes = runner.run_configs(configs, [], [], settings, rounds=3)
    assert ran == ["a", "b", "b", "a", "a", "b"] and notes == []
    assert [r.config.name for r in runs] == ["a", "b"]
    assert [r.round_tok_s for r in runs] == [[[1.0, 4.0, 5.0]], [[2.0, 3.0, 6.0]]]
    assert [r.stats[0].tok_s for r in runs] == [4.0, 3.0]


def test_the_report_shows_every_rounds_tok_s() -> None:
    from benchmarks.load.report import _spread
    from benchmarks.load.results import BenchResult

    merged = median_run([_run("a", [100.0, 900.0]), _run("a", [300.0, 700.0]), _run("a", [200.0, 800.0])])
    lines = _spread(BenchResult({}, [merged], cast(Any, None)))
    assert "| config | p0 | p1 |" in lines and "| a | 100 / 300 / 200 | 900 / 700 / 800 |" in lines
    assert _spread(BenchResult({}, [_run("a", [1.0])], cast(Any, None))) == []
