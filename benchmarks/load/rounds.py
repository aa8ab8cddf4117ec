"""Several rounds of the line-up, each phase judged at its median round.

This VM's speed drifts by up to ±25 % over minutes (no-spec on code at 4 users: 675 tok/s at
one end of a line-up, 494 at the other end of the next), more than the 3 % the claim's
per-phase bound can tell apart. So ``--rounds N`` runs the line-up N times, every other
round in reverse order (a configuration early in one round is late in the next), and each
(configuration, phase) cell takes the stats of its median round by tokens/s (the lower median
for an even N); the whole-run row too, and the records, telemetry and timeline behind the
plots are that round's. The tokens/s of every round are kept (``ConfigRun.round_tok_s``) and
the report shows their spread.
"""

from __future__ import annotations

from dataclasses import replace
from statistics import median_low

from benchmarks.load.results import ConfigRun


def order(names: list[str], rnd: int) -> list[str]:
    """The line-up of round ``rnd`` (from 0): as given, then reversed, and so on."""
    return list(names) if rnd % 2 == 0 else list(reversed(names))


def median_run(runs: list[ConfigRun]) -> ConfigRun:
    """One configuration's rounds as one run: each phase's stats from its median round."""
    if len(runs) == 1:
        return runs[0]
    phases = len(runs[0].stats)
    tok_s = [[r.stats[i].tok_s for r in runs] for i in range(phases)]
    picks = [tok_s[i].index(median_low(tok_s[i])) for i in range(phases)]
    whole = runs[picks[-1]]  # the whole-run row's median round: its records and plots
    stats = [runs[picks[i]].stats[i] for i in range(phases)]
    return replace(whole, stats=stats, round_tok_s=tok_s)
