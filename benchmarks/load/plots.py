"""PNG plots (matplotlib, Agg): γ and throughput over time per configuration, and latency CDFs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: file output only; set before pyplot is imported

import matplotlib.pyplot as plt
import numpy as np

from benchmarks.load.phases import Window
from benchmarks.load.results import ConfigRun


def _shade_phases(ax: plt.Axes, ws: list[Window]) -> None:
    for w in ws:
        if w.index % 2:
            ax.axvspan(w.start_s, w.end_s, color="0.92", zorder=0)
        ax.text((w.start_s + w.end_s) / 2, 0.97, w.phase.name, transform=ax.get_xaxis_transform(),
                ha="center", va="top", fontsize=7, color="0.35")  # fmt: skip


def plot_timelines(runs: list[ConfigRun], ws: list[Window], path: Path) -> Path:
    """One panel per configuration: client tokens/s (left axis), mean γ and offload (right)."""
    fig, axes = plt.subplots(len(runs), 1, figsize=(10, 2.2 * len(runs) + 0.6), sharex=True, squeeze=False)
    for ax, run in zip(axes[:, 0], runs, strict=True):
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
        _mark_drafters(ax, tl.decisions)
        for e in tl.offload_events:
            if e["source"] == "worker":
                ax2.axvline(e["t"], color="tab:red" if e["offload"] else "tab:green", ls=":", lw=0.8)
        ax2.set_ylabel("γ", color="tab:orange")
        top = max([1.0, *[g for g in tl.gamma + tl.decided_gamma if g is not None]])
        ax2.set_ylim(bottom=-0.2, top=top + 0.5)
    axes[0, 0].figure.legend(*_handles(axes[0, 0]), loc="upper right", fontsize=7)
    axes[-1, 0].set_xlabel("seconds since the first phase began")
    fig.suptitle("Throughput and γ over time (dotted: draft offloaded red / reloaded green)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _mark_drafters(ax: plt.Axes, decisions: list[dict[str, Any]]) -> None:
    """Name the decided drafter where it changes (the one in force at the start at 0 s)."""
    last: object = ()
    for d in decisions:
        if d["drafter"] != last and d["t"] is not None:
            name = str(d["drafter"] or "default drafter")
            at = (max(float(d["t"]), 0.0), 0.03)
            ax.annotate(name, at, xycoords=("data", "axes fraction"), fontsize=6, color="tab:purple",
                        rotation=90, va="bottom")  # fmt: skip
        last = d["drafter"]


def _handles(ax: plt.Axes) -> tuple[list[object], list[str]]:
    """The legend entries of an axes and of its twin (the γ axis)."""
    handles: list[object] = []
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
            ax.set_xscale("log")
    axes[0].set_ylabel("fraction of requests")
    axes[2].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
