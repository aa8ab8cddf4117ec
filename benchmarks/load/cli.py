"""``nightjar bench`` / ``python -m benchmarks.load``: the dynamic-load benchmark.

    nightjar bench WORKLOAD [--phases low:0.5:60,high:6:120,low:0.5:60] [--config NAME=POLICY:k=v ...]
    nightjar bench --phases chat_low:4u:60:chat,mixed_high:32u:120:chat+code,code_low:4u:60:code --lineup

Bad input gives one line on stderr and exit code 2; a run that completes exits 0 whatever
the verdict (the verdict is a finding, printed and written to the report). ``nightjar bench
ARGS`` is ``main(ARGS)``: the arguments after the subcommand's name.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
import time
from pathlib import Path

from benchmarks.load import regime
from benchmarks.load.configs import DEFAULT_CONFIGS
from benchmarks.load.verdict import TOLERANCE

REPO = Path(__file__).resolve().parents[2]
DEFAULT_PHASES = "low:0.5:60,high:6:120,low:0.5:60"


def build_parser() -> argparse.ArgumentParser:
    env = regime.BenchEnv()
    p = argparse.ArgumentParser(
        prog="nightjar bench",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,  # every flag's help ends with its default
    )
    p.add_argument("workload", nargs="?", default=None,
                   help="Spec-Bench/ShareGPT/Alpaca JSON(L) or JSONL of {prompt} "
                   "(the prompts of phases without content)")  # fmt: skip
    p.add_argument("--model", default=env.model, help="model dir (env NIGHTJAR_MODEL)")
    p.add_argument("--phases", default=DEFAULT_PHASES,
                   help="name:RATE|Nu:seconds[:content+...],... "
                   "(RATE req/s: open loop; N users: closed loop)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="arrivals, prompt order and sampling seeds")
    p.add_argument("--config", action="append", metavar="NAME=POLICY[:k=v,...]",
                   help=f"a configuration (repeat); default: {'; '.join(DEFAULT_CONFIGS)}")  # fmt: skip
    p.add_argument("--lengths", choices=("fixed", "workload"), default="fixed",
                   help="output lengths: --max-tokens for all, or each item's reference length")  # fmt: skip
    p.add_argument("--max-tokens", type=int, default=64, help="output tokens per request (--lengths fixed)")
    p.add_argument("--min-tokens", type=int, default=8, help="floor of workload lengths")
    p.add_argument("--max-prompt-tokens", type=int, default=512, help="skip longer prompts (0: keep all)")
    p.add_argument("--endpoint", choices=("chat", "completions"), default="chat", help="the OpenAI route")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature of every request")
    p.add_argument("--warmup", type=int, default=4, help="warm-up requests per configuration")
    p.add_argument("--warmup-tokens", type=int, default=8, help="output tokens of each warm-up request")
    p.add_argument("--services", choices=("inprocess", "processes"), default="inprocess",
                   help="in this process on memory://, or nightjar processes on --redis-url")  # fmt: skip
    p.add_argument("--redis-url", default=None,
                   help="processes: this Redis (its nj:* keys are deleted before each config)")  # fmt: skip
    p.add_argument("--max-jobs", type=int, default=16, help="worker: jobs held at once")
    p.add_argument("--engine-opt", action="append", metavar="KEY=VALUE", help="engine option (repeat)")
    p.add_argument("--threads", type=int, default=None, help="torch threads")
    p.add_argument("--drain-timeout", type=float, default=300.0, help="seconds after the last arrival")
    p.add_argument("--bin", type=float, default=1.0, help="timeline bin, seconds")
    p.add_argument("--target", default="nightjar", help="the configuration the claim is about")
    p.add_argument("--tolerance", type=float, default=TOLERANCE, help="relative margin of the verdict")
    p.add_argument("--out", default=None, help="output folder (default runs/bench-TIMESTAMP)")
    p.add_argument("--hf-baseline", action=argparse.BooleanOptionalAction, default=True,
                   help="run the transformers generate baseline on the same prompts")  # fmt: skip
    p.add_argument("--hf-batch-size", type=int, default=8, help="batch size of the static-batch baseline")
    p.add_argument("--hf-requests", type=int, default=32, help="prompts for the static-batch baseline")
    p.add_argument("--hf-assisted", type=int, default=8, help="prompts for assisted generation (batch 1)")
    p.add_argument("--drafter", default=None, help="drafter model dir for assisted generation")
    p.add_argument("--rounds", type=int, default=1,
                   help="run the line-up this many times, every other round reversed; each phase is "
                        "judged at its median round (benchmarks/load/rounds.py)")  # fmt: skip
    p.add_argument("--time-budget", type=float, default=None,
                   help="seconds: skip configurations (then the baseline) that would end later")  # fmt: skip
    regime.add_args(p, env)
    p.add_argument("--no-progress", action="store_true", help="no progress lines while a phase runs")
    p.add_argument("--log-level", default="warning", help="log level of the services")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help, or argparse's own usage error (it printed the message)
        return int(exc.code or 0)
    level = logging.getLevelName(str(args.log_level).upper())
    if not isinstance(level, int):
        print(f"nightjar bench: error: unknown log level {args.log_level!r}", file=sys.stderr)
        return 2
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # The benchmark's own progress lines stay; httpx's line per request would drown the log.
    logging.getLogger("benchmarks").setLevel(min(level, logging.INFO))
    logging.getLogger("httpx").setLevel(max(level, logging.WARNING))
    from benchmarks.load.session import BenchError, run
    from nightjar.options import UsageError

    out = Path(args.out) if args.out else REPO / "runs" / time.strftime("bench-%Y%m%d-%H%M%S")
    try:
        result, outputs = run(args, out, "nightjar bench " + shlex.join(argv))
    except (BenchError, UsageError, ValueError) as exc:
        print(f"nightjar bench: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    v = result.verdict
    print(f"verdict ({v.mode} loop): the claim {v.answer}")
    for c in v.checks:
        op = "≤" if c.at_most else "≥"
        print(f"  {'ok' if c.ok else 'NO'}  {c.name}: {c.value:.3f} ({op} {c.bound:.2f})")
    for path in (outputs.markdown, outputs.json, outputs.timeline_png, outputs.cdf_png, outputs.telemetry):
        print(f"wrote {path}")
    return 0
