"""The target's bare forward with and without the skinny CPU linear kernel, side by side.

For each batch size and rows per sequence (1 = a plain decode row, γ+1 = a verification), the
paged runner's forward is timed with ``F.linear`` (the BLAS) and with ``nj_kernels/cpu_linear``,
interleaved round by round so a drifting machine slows both alike; medians in ms, their
ratio, and each row's cost against the same batch's plain decode step (what a verification
costs in decode steps: the number that decides whether speculation pays).

    taskset -c 1 python -m benchmarks.skinny_bench --model models/smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from nj_kernels import cpu_linear
from worker.engine.model_runner import ForwardItem, ModelRunner
from worker.engine.weights import find_gguf, load_checkpoint


def items(batch: int, rows: int, context: int, block_size: int) -> list[ForwardItem]:
    per_seq = -(-(context + rows) // block_size)
    return [
        ForwardItem([(7 * b + r) % 1000 + 5 for r in range(rows)], context,
                    list(range(b * per_seq, (b + 1) * per_seq)), rows)
        for b in range(batch)
    ]  # fmt: skip


def timed(runner: ModelRunner, its: list[ForwardItem], reps: int) -> float:
    runner.run(its)
    t0 = time.perf_counter()
    for _ in range(reps):
        runner.run(its)
    return (time.perf_counter() - t0) / reps * 1e3


def main(argv: list[str] | None = None) -> int:
    doc = (__doc__ or "").split("\n\n")[0]
    p = argparse.ArgumentParser(prog="python -m benchmarks.skinny_bench", description=doc)
    p.add_argument("--model", default="models/smollm2-135m-instruct")
    p.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 16, 32])
    p.add_argument("--rows", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 3, 5, 9])
    p.add_argument("--context", type=int, default=100)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if not cpu_linear.available():
        print("the skinny kernel cannot be built here")
        return 2
    path = Path(args.model)
    config, state = load_checkpoint(path, find_gguf(path))
    block_size = 16
    blocks = max(args.batches) * (-(-(args.context + max(args.rows)) // block_size)) + 1
    runner = ModelRunner(config, state, block_size, torch.device("cpu"), torch.float32, num_blocks=blocks)
    print(f"{path.name}, {args.threads} torch thread(s), context {args.context}, "
          f"kernel up to {cpu_linear.max_rows()} rows; ms, median of {args.rounds} rounds")  # fmt: skip
    print("| batch | rows / seq | BLAS ms | kernel ms | BLAS / kernel | BLAS × decode | kernel × decode |")
    print("|---|---|---|---|---|---|---|")
    for batch in args.batches:
        got: dict[tuple[int, bool], list[float]] = {}
        for _ in range(args.rounds):
            for rows in args.rows:
                its = items(batch, rows, args.context, block_size)
                reps = max(1, 12 // (batch * rows) + 1)
                for on in (False, True):
                    cpu_linear.set_enabled(on)
                    got.setdefault((rows, on), []).append(timed(runner, its, reps))
        med = {k: statistics.median(v) for k, v in got.items()}
        for rows in args.rows:
            blas, kern = med[(rows, False)], med[(rows, True)]
            print(f"| {batch} | {rows} | {blas:.1f} | {kern:.1f} | {blas / kern:.2f}× | "
                  f"{blas / med[(1, False)]:.2f} | {kern / med[(1, True)]:.2f} |", flush=True)  # fmt: skip
    cpu_linear.set_enabled(True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
