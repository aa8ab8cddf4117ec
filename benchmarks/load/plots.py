"""PNG plots (matplotlib, Agg): γ and throughput over time per configuration, and latency CDFs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: file output only; set before pyplot is imported

import matplotlib.pyplot as plt
import numpy as np
from matplotlib import ticker
from matplotlib.artist import Artist
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from benchmarks.load.phases import Window
from benchmarks.load.results import ConfigRun
from benchmarks.load.timeline import Timeline


def _shade_phases(ax: plt.Axes, ws: list[Window]) -> None:
    for w in ws:
        if w.index % 2:
            ax.axvspan(w.start_s, w.end_s, color="0.92", zorder=0)
        ax.text((w.start_s + w.end_s) / 2, 0.97, w.phase.name, transform=ax.get_xaxis_transform(),
                ha="center", va="top", fontsize=7, color="0.35")  # fmt: skip


def plot_timelines(runs: list[ConfigRun], ws: list[Window], path: Path) -> Path:
    """One panel per configuration: client tokens/s (left axis), mean γ and offload (right)."""
    return _save(timeline_figure(runs, ws), path)


def _save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def timeline_figure(runs: list[ConfigRun], ws: list[Window]) -> Figure:
    fig, axes = plt.subplots(len(runs), 1, figsize=(10, 2.2 * len(runs) + 1.0), sharex=True, squeeze=False)
    spans = [drafter_spans(r.timeline.decisions, _end(r.timeline)) for r in runs]
    names = list(dict.fromkeys(name for run_spans in spans for name, _, _ in run_spans))
    colors = {n: DRAFTER_COLORS[i % len(DRAFTER_COLORS)] for i, n in enumerate(names)}  # one per drafter
    for ax, run, run_spans in zip(axes[:, 0], runs, spans, strict=True):
        tl = run.timeline
        _shade_phases(ax, ws)
        ax.plot(tl.t, tl.tok_s, color="tab:blue", lw=1.2, label="tokens/s (client)")
        ax.set_ylabel("tok/s", color="tab:blue")
        ax.set_title(run.config.spec(), fontsize=8, loc="left")
        ax2 = ax.twinx()
        gamma = [np.nan if g is None else g for g in tl.gamma]
        decided = [np.nan if g is None else g for g in tl.decided_gamma]
        ax2.step(tl.t, gamma, where="mid", color="tab:orange", lw=1.0, label="γ run")
        ax2.step(tl.t, decided, where="mid", color="tab:purple", lw=1.0, ls="--", label="γ decided")
        _mark_drafters(ax, run_spans, colors, _end(tl))
        for e in tl.offload_events:
            if e["source"] == "worker":
                ax2.axvline(e["t"], color="tab:red" if e["offload"] else "tab:green", ls=":", lw=0.8)
        ax2.set_ylabel("γ", color="tab:orange")
        top = max([1.0, *[g for g in tl.gamma + tl.decided_gamma if g is not None]])
        ax2.set_ylim(bottom=-0.2, top=top + 0.5)
    handles, labels = _handles(axes[0, 0])
    for n in names:
        handles.append(Patch(color=colors[n]))
        labels.append(f"drafter {n}")
    axes[-1, 0].set_xlabel("seconds since the first phase began")
    fig.suptitle(
        "Throughput and γ over time (dotted: draft offloaded red / reloaded green; "
        "strip at the foot: the decided drafter)",
        fontsize=9,
    )
    fig.tight_layout(rect=(0, 0.6 / (2.2 * len(runs) + 1.0), 1, 1))
    fig.legend(handles, labels, loc="lower center", fontsize=7, ncol=min(len(labels), 5), frameon=False)
    return fig


def _end(tl: Timeline) -> float:
    return max([*tl.t, 0.0]) + tl.bin_s / 2


# Not blue, orange, purple, red or green: tokens/s, γ run, γ decided and offload use those.
DRAFTER_COLORS = ("tab:olive", "tab:cyan", "tab:brown", "tab:pink", "tab:gray", "gold", "black")


def drafter_spans(decisions: list[dict[str, Any]], end_s: float) -> list[tuple[str, float, float]]:
    """(drafter, start, end) while each decided drafter was in force, on the run's clock: a
    decision made before the run (negative t) holds from 0; adjacent spans of one drafter
    are merged, so a planner that re-publishes the same drafter draws one span."""
    spans: list[tuple[str, float, float]] = []
    timed = sorted(
        (float(d["t"]), str(d["drafter"] or "default drafter")) for d in decisions if d["t"] is not None
    )
    for i, (t, name) in enumerate(timed):
        start = min(max(t, 0.0), end_s)
        stop = min(max(timed[i + 1][0], 0.0), end_s) if i + 1 < len(timed) else end_s
        if stop <= start and i + 1 < len(timed):
            continue  # replaced before the run began (or at the same instant)
        if spans and spans[-1][0] == name:
            spans[-1] = (name, spans[-1][1], max(stop, spans[-1][2]))
        else:
            spans.append((name, start, max(stop, start)))
    return spans


def _mark_drafters(
    ax: plt.Axes, spans: list[tuple[str, float, float]], colors: dict[str, str], end_s: float
) -> None:
    """A strip along the panel's foot, coloured by the decided drafter in force (one legend
    entry per drafter for the figure): switches stay readable however many there are, even
    many at once, where names written at each switch piled up."""
    for name, start, stop in spans:
        ax.axvspan(start, max(stop, start + end_s / 500), ymin=0.0, ymax=0.04, color=colors[name], lw=0)


def _log_axis(ax: plt.Axes) -> None:
    """A log x axis with few, unoverlapping labels: 1-2-5 steps over up to two decades,
    powers of ten beyond; no minor-tick labels (they ran together on narrow ranges). A panel
    with no positive value (e.g. a run too short to have any) keeps its linear axis."""
    if not ax.dataLim.intervalx[1] > 0:
        return
    ax.set_xscale("log")
    lo, hi = ax.get_xlim()
    decades = np.log10(hi / lo) if lo > 0 and hi > lo else 0.0
    subs = (1.0, 2.0, 5.0) if decades <= 2.5 else (1.0,)
    ax.xaxis.set_major_locator(ticker.LogLocator(base=10, subs=subs, numticks=12))
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_locator(ticker.LogLocator(base=10, subs=[float(k) for k in range(2, 10)], numticks=12))
    ax.xaxis.set_minor_formatter(ticker.NullFormatter())


def _handles(ax: plt.Axes) -> tuple[list[Artist], list[str]]:
    """The legend entries of an axes and of its twin (the γ axis)."""
    handles: list[Artist] = []
    labels: list[str] = []
    for a in (ax, *ax.get_shared_x_axes().get_siblings(ax)):
        h, lab = a.get_legend_handles_labels()
        for one, name in zip(h, lab, strict=True):
            if name not in labels:
                handles.append(one)
                labels.append(name)
    return handles, labels


def _cdf(ax: plt.Axes, values: list[float], label: str) -> None:
    if values:
        xs = np.sort(np.asarray(values))
        ax.plot(xs, np.arange(1, len(xs) + 1) / len(xs), lw=1.2, label=label)


def plot_cdfs(runs: list[ConfigRun], path: Path) -> Path:
    """TTFT, TPOT and end-to-end latency CDFs, one line per configuration."""
    return _save(cdf_figure(runs), path)


def cdf_figure(runs: list[ConfigRun]) -> Figure:
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for run in runs:
        ok = [r for r in run.records if r.ok]
        _cdf(axes[0], [v * 1e3 for r in ok if (v := r.ttft) is not None], run.config.name)
        _cdf(axes[1], [v * 1e3 for r in ok if (v := r.tpot) is not None], run.config.name)
        _cdf(axes[2], [v for r in ok if (v := r.e2e) is not None], run.config.name)
    for ax, title in zip(axes, ("TTFT (ms)", "TPOT (ms)", "end-to-end latency (s)"), strict=True):
        ax.set_title(title, fontsize=9)
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        if ax.get_lines():
            _log_axis(ax)
        ax.tick_params(axis="x", labelsize=7)
    axes[0].set_ylabel("fraction of requests")
    # One legend for the three panels (the same lines in each), under them.
    handles: list[Artist] = []
    labels: list[str] = []
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6), fontsize=8, frameon=False)
    return fig
