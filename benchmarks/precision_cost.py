"""Speculation's cost curve per precision: a verification of γ+1 rows against a decode row.

For each precision of the same model, the target's bare forward (the paged runner, as the
engine runs it) is timed per batch size and rows per sequence (1 = a plain decode step, γ+1 =
a verification), precisions interleaved round by round so a drifting machine slows all alike;
medians of thread CPU time in ms, and each row count's cost in decode steps of the same batch
(the number that decides whether speculation pays: a verify costing c decode steps pays when
it emits more than c tokens a step on average).

Precisions: ``fp32`` is today's torch path (the safetensors export, ``--dtype fp32``); the
others are GGUF files served from their blocks: the shipped Q4_1, and F32 / F16 / Q8_0 / Q4_0
variants of the same weights written by ``benchmarks.gguf_variants`` (F32 holds exactly the
fp32 export's values).

    taskset -c 1 python -m benchmarks.precision_cost --model models/smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

from benchmarks.gguf_variants import write_variant
from worker.engine.loader import load_engine
from worker.engine.model_runner import ForwardItem, ModelRunner

VARIANTS_DIR = Path("models/gguf-variants")


def items(batch: int, rows: int, context: int, block_size: int) -> list[ForwardItem]:
    per_seq = -(-(context + rows) // block_size)
    return [
        ForwardItem([(7 * b + r) % 1000 + 5 for r in range(rows)], context,
                    list(range(b * per_seq, (b + 1) * per_seq)), rows)
        for b in range(batch)
    ]  # fmt: skip


def timed(runner: ModelRunner, its: list[ForwardItem], reps: int) -> float:
    runner.run(its)
    t0 = time.thread_time()
    for _ in range(reps):
        runner.run(its)
    return (time.thread_time() - t0) / reps * 1e3


def runners(model: Path, precisions: list[str], blocks: int) -> dict[str, ModelRunner]:
    """One runner per precision (the engine's own target runner)."""
    source = next(model.glob("*.gguf"), None)
    out: dict[str, ModelRunner] = {}
    for p in precisions:
        if p == "fp32":
            engine = load_engine(model, num_blocks=blocks, dtype="float32", ngram=False)
        else:
            if source is None:
                raise SystemExit(f"{model} holds no GGUF file (run `nightjar models smollm2`)")
            variant = VARIANTS_DIR / f"{model.name}.{p}.gguf"
            path = source if p in source.name else write_variant(source, variant, p)
            engine = load_engine(path, num_blocks=blocks, ngram=False)
        print(f"{p}: {engine.weights}, {engine.runner.weight_bytes / 1e6:.0f} MB of weights", flush=True)
        out[p] = engine.runner
    return out


def main(argv: list[str] | None = None) -> int:
    doc = (__doc__ or "").split("\n\n")[0]
    p = argparse.ArgumentParser(prog="python -m benchmarks.precision_cost", description=doc)
    p.add_argument("--model", type=Path, default=Path("models/smollm2-135m-instruct"))
    p.add_argument("--precisions", default="fp32,F32,Q8_0,Q4_1", help="comma-separated: fp32 and GGUF types")
    p.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 16, 32])
    p.add_argument("--rows", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 3, 5])
    p.add_argument("--context", type=int, default=100)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    block_size = 16
    blocks = max(args.batches) * (-(-(args.context + max(args.rows)) // block_size)) + 1
    run = runners(args.model, args.precisions.split(","), blocks)
    load = os.getloadavg()
    print(f"\n{args.model.name}, {args.threads} torch thread(s), context {args.context}; ms of thread "
          f"CPU time, median of {args.rounds} rounds; load average {' '.join(f'{x:.1f}' for x in load)}")
    names = list(run)
    print("| batch | rows / seq | " + " | ".join(f"{n} ms" for n in names) + " | "
          + " | ".join(f"{n} × decode" for n in names) + " |")  # fmt: skip
    print("|---|---|" + "---|" * (2 * len(names)))
    for batch in args.batches:
        got: dict[tuple[int, str], list[float]] = {}
        for _ in range(args.rounds):
            for rows in args.rows:
                its = items(batch, rows, args.context, block_size)
                reps = max(1, 8 // (batch * rows) + 1)
                for n in names:
                    got.setdefault((rows, n), []).append(timed(run[n], its, reps))
        med = {k: statistics.median(v) for k, v in got.items()}
        for rows in args.rows:
            ms = " | ".join(f"{med[(rows, n)]:.1f}" for n in names)
            rel = " | ".join(f"{med[(rows, n)] / med[(1, n)]:.2f}" for n in names)
            print(f"| {batch} | {rows} | {ms} | {rel} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
