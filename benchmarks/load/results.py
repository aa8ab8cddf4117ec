"""What one benchmark run produced: per configuration its records, telemetry, numbers and
timeline; the transformers baseline rows; the verdict. Serialised to JSON here."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.load.client import RequestRecord
from benchmarks.load.configs import BenchConfig
from benchmarks.load.metrics import PhaseStats
from benchmarks.load.phases import Window
from benchmarks.load.timeline import Timeline
from benchmarks.load.verdict import Verdict
from shared.control import Decision, Telemetry


@dataclass
class BaselineRow:
    """One row of the transformers baseline, shown beside the configurations."""

    name: str
    requests: int
    output_tokens: int
    wall_s: float
    tok_s: float
    e2e_p50: float | None = None
    e2e_p99: float | None = None
    note: str = ""


@dataclass
class ConfigRun:
    config: BenchConfig
    t0_wall: float
    wall_s: float  # the configuration's load run, warm-up excluded
    records: list[RequestRecord]
    telemetry: list[Telemetry]
    decisions: list[Decision]
    stats: list[PhaseStats]
    timeline: Timeline
    warmup_errors: list[str] = field(default_factory=list)
    windows: list[Window] | None = None  # closed loop: where each phase really ran
    round_tok_s: list[list[float]] = field(default_factory=list)  # per stats row: each round's tok/s


@dataclass
class BenchResult:
    meta: dict[str, Any]
    runs: list[ConfigRun]
    verdict: Verdict
    skipped: list[str] = field(default_factory=list)
    baseline: list[BaselineRow] = field(default_factory=list)


def _record(r: RequestRecord) -> dict[str, Any]:
    d = dataclasses.asdict(r)
    d.update(ttft=r.ttft, tpot=r.tpot, e2e=r.e2e, chunks=len(r.chunk_s))
    del d["chunk_s"]  # the timeline keeps the throughput they make; the file stays small
    return d


def to_json(result: BenchResult) -> dict[str, Any]:
    v = result.verdict
    return {
        "meta": result.meta,
        "skipped": result.skipped,
        "configs": [
            {
                "name": run.config.name,
                "policy": run.config.policy,
                "params": run.config.params,
                "static": run.config.is_static,
                "wall_s": run.wall_s,
                "warmup_errors": run.warmup_errors,
                "phases": [dataclasses.asdict(p) for p in run.stats],
                "round_tok_s": run.round_tok_s,
                "timeline": dataclasses.asdict(run.timeline),
                "telemetry_steps": len(run.telemetry),
                "windows": [[w.label, w.start_s, w.end_s] for w in run.windows or []],
                "requests": [_record(r) for r in run.records],
            }
            for run in result.runs
        ],
        "baseline": [dataclasses.asdict(b) for b in result.baseline],
        "verdict": verdict_json(v),
    }


def verdict_json(v: Verdict) -> dict[str, Any]:
    return {
        "target": v.target,
        "mode": v.mode,
        "tolerance": v.tolerance,
        "missing": v.missing,
        "holds": v.holds,
        "answer": v.answer,
        "statics": v.statics,
        "geomean": v.geomean,
        "oracle": {
            "margin": v.oracle_margin,
            "room": v.oracle_room,
            "phases": [dataclasses.asdict(c) | {"ratio": c.ratio} for c in v.phases],
        },
        "tpot_mean": v.tpot,
        "latency_e2e": {k: list(x) for k, x in v.latency.items()},
        "goodput_tok_s": v.goodput,
        "checks": [dataclasses.asdict(c) | {"ok": c.ok} for c in v.checks],
    }


def finite(obj: Any) -> Any:
    """``obj`` with every infinite or NaN float replaced by None (JSON has neither)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite(v) for v in obj]
    return obj


def write_json(result: BenchResult, path: Path) -> Path:
    path.write_text(json.dumps(finite(to_json(result)), indent=1, allow_nan=False))
    return path


def write_telemetry(result: BenchResult, path: Path) -> Path:
    """Every telemetry step the run read, one JSON line each, with its configuration's name
    (and ``t_s``: seconds since the configuration's load started): for a breakdown the
    report does not make, e.g. where a configuration's step time went."""
    with path.open("w") as f:
        for run in result.runs:
            for t in run.telemetry:
                row = {"config": run.config.name, "t_s": t.ts - run.t0_wall, **t.model_dump(mode="json")}
                f.write(json.dumps(finite(row)) + "\n")
    return path
