"""The markdown report: how the run was made (CPU pinning beside the numbers), one table of
every configuration and phase (with the oracle and the transformers baseline as rows), the
claim's verdict, and what was skipped."""

from __future__ import annotations

from pathlib import Path

from benchmarks.load.metrics import WHOLE_RUN, Dist, PhaseStats
from benchmarks.load.results import BaselineRow, BenchResult
from benchmarks.load.verdict_report import verdict_markdown

HEADER = (
    "| config | phase | requests ok/sent | out tok/s | goodput tok/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms "
    "| E2E p50 / p99 s | acceptance | γ run / decided | γ mix | drafters | offloaded | KV max |"
)
RULE = "|" + "---|" * 14


def _ms(d: Dist) -> str:
    return "–" if d.p50 is None or d.p99 is None else f"{d.p50 * 1e3:.0f} / {d.p99 * 1e3:.0f}"


def _s(d: Dist) -> str:
    return "–" if d.p50 is None or d.p99 is None else f"{d.p50:.2f} / {d.p99:.2f}"


def _opt(x: float | None, fmt: str) -> str:
    return "–" if x is None else format(x, fmt)


def _mix(shares: dict[int, float] | dict[str, float]) -> str:
    return " ".join(f"{k}:{v:.0%}" for k, v in shares.items()) or "–"


def stats_row(config: str, p: PhaseStats) -> str:
    return (
        f"| {config} | {p.label} | {p.completed}/{p.requests} | {p.tok_s:.1f} | {p.goodput_tok_s:.1f} "
        f"| {_ms(p.ttft)} | {_ms(p.tpot)} | {_s(p.e2e)} | {_opt(p.acceptance, '.2f')} "
        f"| {_opt(p.mean_gamma, '.2f')} / {_opt(p.decided_gamma, '.2f')} | {_mix(p.gamma_share)} "
        f"| {_mix(p.drafter_share)} | {_opt(p.offloaded_share, '.0%')} | {_opt(p.kv_max, '.0%')} |"
    )


def baseline_row(b: BaselineRow) -> str:
    e2e = "–" if b.e2e_p50 is None or b.e2e_p99 is None else f"{b.e2e_p50:.2f} / {b.e2e_p99:.2f}"
    return (
        f"| {b.name} | offline | {b.requests}/{b.requests} | {b.tok_s:.1f} | – | – | – | {e2e} "
        "| – | – | – | – | – | – |"
    )


def _throughput_note(meta: dict[str, object]) -> list[str]:
    if meta.get("loop") == "closed":
        return [
            "Closed loop: the phases run one after another, each starting once the last one's requests",
            "are answered; a phase's throughput is the tokens streamed inside it over its duration (its",
            "capacity at that many users; the drain between phases counts for none); `all` divides",
            "every token by the makespan (to the last",
        ]
    return [
        "A phase's throughput is its arrival cohort's: the tokens of the requests that arrived in it over",
        "the time from its start to the later of its end and their last response, so a backlog counts",
        "against the phase that made it; `all` divides every token by the makespan (to the last",
    ]


def _loop(meta: dict[str, object]) -> str:
    if meta.get("loop") == "closed":
        return "closed loop: N users per phase, each sending its next request when its last is answered"
    return "open loop: Poisson arrivals"


def oracle_rows(result: BenchResult) -> list[str]:
    """Each phase's best static configuration (the oracle stitches them)."""
    v = result.verdict
    if v.missing or not v.phases:
        return []
    by_name = {r.config.name: {p.label: p for p in r.stats} for r in result.runs}
    return [stats_row(f"oracle ({c.best_static})", by_name[c.best_static][c.label]) for c in v.phases]


def render(result: BenchResult) -> str:
    m = result.meta
    lines = [
        "# Nightjar under dynamic load",
        "",
        f"- command: `{m.get('command', '')}`",
        f"- machine: {m.get('machine', '')}",
        f"- model: `{m.get('model', '')}`; engine options: {m.get('engine', {}) or 'defaults'}; "
        f"services: {m.get('services', '')}",
        f"- workload: `{m.get('workload', '')}` ({m.get('workload_format', '')}, "
        f"{m.get('prompts', 0)} usable prompts); endpoint {m.get('endpoint', '')}; "
        f"output lengths {m.get('lengths', '')}; ignore_eos",
        f"- phases: {m.get('phases', '')} ({_loop(m)}, seed {m.get('seed')}); "
        f"requests per configuration: {m.get('requests', 0)}; warm-up {m.get('warmup', 0)} requests",
        f"- loop: {m.get('loop', 'open')}; SLO for goodput: {m.get('slo', '')}",
        f"- CPUs: {m.get('pinning', 'not pinned')}; "
        f"worker torch threads: {m.get('worker_threads') or 'default'}",
        f"- started {m.get('started', '')}; total wall time {m.get('wall_s', 0):.0f} s",
        "",
        "Timings come from one machine whose cores may be shared; expect noise of several percent.",
        *_throughput_note(m),
        "response). Latencies of a phase are those of requests arriving in it. Acceptance, γ,",
        "drafters, offload and KV come from the worker's telemetry: γ run is the",
        "mean γ of the decode steps, γ decided the mean γ that the decision each step ran under gave",
        "its batch size (they differ when the engine cannot follow the planner, e.g. without a drafter).",
        "",
        HEADER,
        RULE,
    ]
    for run in result.runs:
        for p in run.stats:
            lines.append(stats_row(run.config.name, p))
    lines += oracle_rows(result)
    lines += _spread(result)
    for b in result.baseline:
        lines.append(baseline_row(b))
    notes = [f"- {b.name}: {b.note}" for b in result.baseline if b.note]
    if notes:
        lines += [
            "",
            "Baseline (transformers `generate`, outside the project, all prompts available at once):",
            *notes,
        ]
    lines += ["", "## Verdict", "", *verdict_markdown(result.verdict)]
    if not any(p.proposed for run in result.runs for p in run.stats):
        lines += [
            "",
            "Caution: no configuration proposed a single draft token — the engine in use did not",
            "speculate, so the configurations ran the same way and their differences are noise.",
        ]
    configs = [
        f"- {r.config.spec()}" + (f" (warm-up errors: {len(r.warmup_errors)})" if r.warmup_errors else "")
        for r in result.runs
    ]
    lines += ["", "## Configurations", "", *configs]
    if result.skipped:
        lines += ["", "Not run:", *[f"- {s}" for s in result.skipped]]
    errors = {r.config.name: next(p for p in r.stats if p.label == WHOLE_RUN).errors for r in result.runs}
    if any(errors.values()):
        lines += ["", "Requests that failed: " + ", ".join(f"{k} {v}" for k, v in errors.items() if v)]
    return "\n".join(lines) + "\n"


def _spread(result: BenchResult) -> list[str]:
    """Each cell's tokens/s in every round, where the line-up ran more than once."""
    runs = [r for r in result.runs if len(r.round_tok_s[0] if r.round_tok_s else []) > 1]
    if not runs:
        return []
    labels = [p.label for p in runs[0].stats]
    out = [
        "",
        "Rounds (`--rounds`; every other round in reverse order; the table above holds each cell's "
        "median round): out tok/s of each round, in the order they ran",
        "",
        "| config | " + " | ".join(labels) + " |",
        "|---|" + "---|" * len(labels),
    ]
    for r in runs:
        cells = [" / ".join(f"{x:.0f}" for x in xs) for xs in r.round_tok_s]
        out.append(f"| {r.config.name} | " + " | ".join(cells) + " |")
    return out


def write_markdown(result: BenchResult, path: Path) -> Path:
    path.write_text(render(result))
    return path
