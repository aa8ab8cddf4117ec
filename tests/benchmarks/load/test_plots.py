"""The benchmark plots: TPOT's log axis has readable labels, drafter switches do not pile up,
and the CDF figure has one legend for its three panels."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

import pytest

from benchmarks.load import plots
from benchmarks.load.client import RequestRecord
from benchmarks.load.configs import BenchConfig
from benchmarks.load.phases import Phase, Window
from benchmarks.load.results import ConfigRun
from benchmarks.load.timeline import Timeline


def _records(seed: int, tpot_s: float) -> list[RequestRecord]:
    rng = random.Random(seed)
    out = []
    for i in range(200):
        sent = i * 0.1
        first = sent + rng.uniform(0.01, 3.0)
        per = tpot_s * rng.uniform(0.6, 2.5)  # a narrow range: under two decades, like the real TPOT
        chunks = [first + k * per for k in range(16)]
        out.append(
            RequestRecord(
                index=i,
                window=0,
                arrival_s=sent,
                max_tokens=16,
                sent_s=sent,
                first_token_s=first,
                end_s=chunks[-1],
                chunk_s=chunks,
                completion_tokens=16,
                status=200,
            )
        )
    return out


def _run(name: str, seed: int, switches: int) -> ConfigRun:
    tl = Timeline(bin_s=1.0, t=[i + 0.5 for i in range(60)], tok_s=[100.0] * 60, gamma=[2.0] * 60,
                  decided_gamma=[2.0] * 60)  # fmt: skip
    names = ["nj-draft-prose", "nj-draft-code", "ngram"]
    # A Hedge-style start: many switches in the first seconds, one made before the run began.
    tl.decisions = [{"t": -3.0, "drafter": None}] + [
        {"t": 0.05 * k, "drafter": names[k % 3]} for k in range(switches)
    ] + [{"t": 30.0, "drafter": "ngram"}, {"t": 31.0, "drafter": "ngram"}]  # fmt: skip
    records = _records(seed, 0.004)
    return ConfigRun(config=BenchConfig(name, "static"), t0_wall=0.0, wall_s=60.0, records=records,
                     telemetry=[], decisions=[], stats=[], timeline=tl)  # fmt: skip


def test_drafter_spans_clip_merge_and_cover_the_run() -> None:
    spans = plots.drafter_spans(
        [{"t": -5.0, "drafter": None}, {"t": -1.0, "drafter": "a"}, {"t": 2.0, "drafter": "a"},
         {"t": 4.0, "drafter": "b"}, {"t": None, "drafter": "c"}],
        end_s=10.0,
    )  # fmt: skip
    assert spans == [("a", 0.0, 4.0), ("b", 4.0, 10.0)]
    assert plots.drafter_spans([], 5.0) == []


def _overlaps(labels: Sequence[object], renderer: object) -> list[tuple[str, str]]:
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in labels if t.get_text()]  # type: ignore[attr-defined]
    return [(a, b) for i, (a, ba) in enumerate(boxes) for b, bb in boxes[i + 1 :] if ba.overlaps(bb)]


def test_cdf_axes_read_cleanly_and_share_one_legend(tmp_path: Path) -> None:
    runs = [_run(n, i, 3) for i, n in enumerate(["no-spec", "static-2", "static-4", "nightjar"])]
    fig = plots.cdf_figure(runs)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    for ax in fig.axes:
        assert ax.get_xscale() == "log"
        shown = [
            t
            for t in ax.get_xticklabels()
            if t.get_text() and ax.get_xlim()[0] <= t.get_position()[0] <= ax.get_xlim()[1]
        ]
        assert len(shown) >= 2, ax.get_title()
        assert not _overlaps(shown, renderer), (ax.get_title(), [t.get_text() for t in shown])
        assert ax.get_legend() is None  # no per-panel legend ...
        assert not [t for t in ax.get_xticklabels(minor=True) if t.get_text()]
    (legend,) = fig.legends  # ... one for the figure, with every configuration
    assert [t.get_text() for t in legend.get_texts()] == ["no-spec", "static-2", "static-4", "nightjar"]
    assert plots.plot_cdfs(runs, tmp_path / "cdf.png").stat().st_size > 10_000


@pytest.mark.parametrize("switches", [0, 60])
def test_drafter_switches_do_not_pile_up(tmp_path: Path, switches: int) -> None:
    runs = [_run("static-2", 0, 0), _run("nightjar", 1, switches)]
    ws = [Window(0, Phase("low", 1.0, 30.0), 0.0, 30.0), Window(1, Phase("high", 5.0, 30.0), 30.0, 60.0)]
    fig = plots.timeline_figure(runs, ws)
    fig.canvas.draw()
    for ax in fig.axes[: len(runs)]:  # the tokens/s axes (their γ twins come after)
        texts = [t.get_text() for t in ax.texts]
        assert texts == ["low", "high"]  # the phase names only: drafters are a strip, not labels
        assert not [a for a in ax.get_children() if type(a).__name__ == "Annotation"]
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "drafter default drafter" in labels and "drafter ngram" in labels
    assert len(labels) == len(set(labels))
    if switches:
        assert {"drafter nj-draft-prose", "drafter nj-draft-code"} <= set(labels)
    assert plots.plot_timelines(runs, ws, tmp_path / "tl.png").stat().st_size > 10_000
