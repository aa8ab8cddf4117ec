"""fp32 decode against the memory floor: the bare forward beside a single-core streaming read.

A decode forward of a small fp32 model reads every weight once, so its floor is weight bytes /
the read bandwidth of the core it runs on. This script measures both in one run, alternating
round by round (other processes load the memory bus, so only same-round ratios mean much): a
streaming read of a buffer larger than the caches (``benchmarks/stream_read.c``, with 4 KiB and
with 2 MiB pages; the floor takes the faster), and ``ModelRunner.run`` at batch 1, one row at a
context of ``--context`` tokens. Beside them runs the same forward as before the fused path
(op by op in torch, products through the skinny kernel, weights where the loader put them), and
the two changes one at a time (the fused path on weights as loaded, the op-by-op path on the
arena), and a table of batches × rows per sequence (1 = decode, γ+1 = a verification), before
and after.

    taskset -c 1 python -m benchmarks.floor_bench --model models/smollm2-135m-instruct

Pin it to one core (taskset): the floor is one core's. Medians over ``--rounds``.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import hashlib
import mmap
import os
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import torch

from nj_kernels import cpu_decode, cpu_linear, weight_arena
from worker.engine.model_runner import ForwardItem, ModelRunner
from worker.engine.weights import find_gguf, load_checkpoint

STREAM_SOURCE = Path(__file__).with_name("stream_read.c")


Clock = tuple[float, float]  # (wall seconds, this thread's CPU seconds)


def clock() -> Clock:
    return time.perf_counter(), time.thread_time()


def since(t0: Clock, reps: int = 1) -> Clock:
    t1 = clock()
    return (t1[0] - t0[0]) / reps, (t1[1] - t0[1]) / reps


def stream_reader() -> Callable[[torch.Tensor], Clock]:
    """``read(buffer) -> (wall, cpu) seconds`` of one streaming pass (compiled on first use)."""
    src = STREAM_SOURCE.read_bytes() + cpu_linear.HEADERS[0].read_bytes()
    key = hashlib.sha256(src + cpu_linear._machine_key().encode()).hexdigest()[:16]
    out = cpu_linear._cache_dir() / f"stream_read-{key}.so"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        flags = [*cpu_linear.FLAGS, "-I", str(cpu_linear.SOURCE.parent)]
        subprocess.run([os.environ.get("CC", "cc"), *flags, "-o", str(out), str(STREAM_SOURCE)], check=True)
    fn = ctypes.CDLL(str(out)).nj_stream_read
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t], ctypes.c_float

    def read(buf: torch.Tensor) -> Clock:
        t0 = clock()
        fn(buf.data_ptr(), buf.numel())
        return since(t0)

    return read


def read_buffer(nbytes: int, huge: bool) -> tuple[mmap.mmap, torch.Tensor]:
    """A private anonymous mapping of ``nbytes`` of ones, advised for huge pages or not."""
    area = mmap.mmap(-1, nbytes + weight_arena.HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if huge:
        area.madvise(mmap.MADV_HUGEPAGE)
    elif hasattr(mmap, "MADV_NOHUGEPAGE"):
        area.madvise(mmap.MADV_NOHUGEPAGE)
    raw = torch.frombuffer(area, dtype=torch.uint8)
    start = (-raw.data_ptr()) % weight_arena.HUGE
    buf = raw[start : start + nbytes].view(torch.float32)
    buf.fill_(1.0)
    return area, buf


def tensor(w: object) -> torch.Tensor:
    """A weight of the fp32 path (this benchmark loads no GGUF blocks)."""
    if not isinstance(w, torch.Tensor):
        raise TypeError("floor_bench measures the fp32 path: its weights are tensors")
    return w


def unpack(runner: ModelRunner) -> None:
    """Each weight in an allocation of its own, as the loader leaves it without the arena."""
    m = runner.model
    for layer in m.layers:
        for name, t in vars(layer).items():
            if t is not None:
                setattr(layer, name, tensor(t).clone())
    tied = m.lm_head is m.embed
    m.embed, m.norm = tensor(m.embed).clone(), m.norm.clone()
    m.lm_head = m.embed if tied else tensor(m.lm_head).clone()
    m.weights_changed()


def items(batch: int, rows: int, context: int, block_size: int) -> list[ForwardItem]:
    per_seq = -(-(context + rows) // block_size)
    return [
        ForwardItem([(7 * b + r) % 1000 + 5 for r in range(rows)], context,
                    list(range(b * per_seq, (b + 1) * per_seq)), rows)
        for b in range(batch)
    ]  # fmt: skip


def machine() -> str:
    info = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    name = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "?")
    isa = "AVX-512" if " avx512f" in info else "AVX2" if " avx2" in info else "no AVX2"
    return f"{name}, {isa}, {os.cpu_count()} CPUs, pinned to {sorted(os.sched_getaffinity(0))}"


def main(argv: list[str] | None = None) -> int:
    doc = (__doc__ or "").split("\n\n")[0]
    p = argparse.ArgumentParser(prog="python -m benchmarks.floor_bench", description=doc)
    p.add_argument("--model", default="models/smollm2-135m-instruct")
    p.add_argument("--context", type=int, default=200)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--reps", type=int, default=3, help="batch-1 forwards a round and path")
    p.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",") if x], default=[1, 4, 16, 32])
    p.add_argument("--rows", type=lambda s: [int(x) for x in s.split(",") if x], default=[1, 3, 5])
    p.add_argument("--table-rounds", type=int, default=3)
    p.add_argument("--read-mib", type=int, default=1024)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    fused_rows = cpu_decode.max_rows()
    if not cpu_decode.available():
        print("the CPU kernels cannot be built here")
        return 2
    path = Path(args.model)
    config, state = load_checkpoint(path, find_gguf(path))
    bs = 16
    blocks = max([1, *args.batches]) * (-(-(args.context + max([1, *args.rows])) // bs)) + 1
    after = ModelRunner(config, state, bs, torch.device("cpu"), torch.float32, num_blocks=blocks)
    before = ModelRunner(config, state, bs, torch.device("cpu"), torch.float32, num_blocks=blocks)
    unpack(before)
    del state
    read = stream_reader()
    nbytes = args.read_mib << 20
    buffers = {huge: read_buffer(nbytes, huge) for huge in (False, True)}
    gc.collect()
    gc.freeze()  # as the worker does before serving
    wbytes = after.weight_bytes
    load0 = os.getloadavg()
    huge = weight_arena.huge_page_bytes(tensor(after.model.layers[0].qkv)) > 0
    print(f"{machine()}; {path.name}, fp32, 1 torch thread, {wbytes / 1e6:.1f} MB of weights; "
          f"weights on huge pages: {huge}")  # fmt: skip

    def forward(runner: ModelRunner, its: list[ForwardItem], fused: bool, reps: int) -> Clock:
        cpu_decode.set_enabled(fused)
        runner.run(its)
        t0 = clock()
        for _ in range(reps):
            runner.run(its)
        return since(t0, reps)

    one = items(1, 1, args.context, bs)
    got: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.rounds):
        t4k, thuge = read(buffers[False][1]), read(buffers[True][1])
        runs = {
            "after": forward(after, one, True, args.reps),
            "before": forward(before, one, False, args.reps),
            "fused_only": forward(before, one, True, args.reps),
            "arena_only": forward(after, one, False, args.reps),
        }
        for c in (0, 1):  # wall, CPU
            floor_s = wbytes * min(t4k[c], thuge[c]) / nbytes
            got.setdefault(("4k", c), []).append(t4k[c])
            got.setdefault(("huge", c), []).append(thuge[c])
            for k, v in runs.items():
                got.setdefault((k, c), []).append(v[c])
                got.setdefault(("r_" + k, c), []).append(v[c] / floor_s)
    med = {k: statistics.median(v) for k, v in got.items()}
    floor_ms = [0.0, 0.0]
    for c, clock_name in ((0, "wall clock"), (1, "thread CPU time")):
        bw4k, bwhuge = nbytes / med[("4k", c)] / 1e9, nbytes / med[("huge", c)] / 1e9
        floor_ms[c] = wbytes / max(bw4k, bwhuge) / 1e6
        print(f"\n{clock_name}: single-core read of {args.read_mib} MiB {bw4k:.2f} GB/s (4 KiB pages), "
              f"{bwhuge:.2f} GB/s (2 MiB pages): floor {floor_ms[c]:.2f} ms")  # fmt: skip
    print(f"\nbatch 1, 1 row, context {args.context}, medians of {args.rounds} rounds; × floor per round is "
          f"the median of each round's forward / that round's floor:")  # fmt: skip
    print("| path | wall ms | × floor | × floor per round | CPU ms | × floor | × floor per round |")
    print("|---|---|---|---|---|---|---|")
    paths = (
        ("before: op by op, weights as loaded", "before"),
        ("op by op, weight arena", "arena_only"),
        ("fused, weights as loaded", "fused_only"),
        ("after: fused, weight arena", "after"),
    )
    for name, key in paths:
        cells = []
        for c in (0, 1):
            ms = med[(key, c)] * 1e3
            cells.append(f"{ms:.2f} | {ms / floor_ms[c]:.3f} | {med[('r_' + key, c)]:.3f}")
        print(f"| {name} | {' | '.join(cells)} |")
    print(f"before / after (wall): {med[('before', 0)] / med[('after', 0)]:.3f}×", flush=True)

    if args.batches:
        print(f"\nbatches × rows a sequence, context {args.context}, thread CPU ms, medians of "
              f"{args.table_rounds} rounds, fused up to {fused_rows} rows:")  # fmt: skip
        print("| batch | rows / seq | before ms | after ms | before / after | before × decode "
              "| after × decode |")  # fmt: skip
        print("|---|---|---|---|---|---|---|")
        for batch in args.batches:
            t: dict[tuple[int, str], list[float]] = {}
            for _ in range(args.table_rounds):
                for rows in args.rows:
                    its = items(batch, rows, args.context, bs)
                    reps = max(2, 16 // (batch * rows))
                    t.setdefault((rows, "b"), []).append(forward(before, its, False, reps)[1])
                    t.setdefault((rows, "a"), []).append(forward(after, its, True, reps)[1])
            m = {k: statistics.median(v) * 1e3 for k, v in t.items()}
            for rows in args.rows:
                b, a = m[(rows, "b")], m[(rows, "a")]
                note = "" if batch * rows <= fused_rows else " (op by op both)"
                print(f"| {batch} | {rows} | {b:.1f} | {a:.1f} | {b / a:.2f}×{note} | "
                      f"{b / m[(1, 'b')]:.2f} | {a / m[(1, 'a')]:.2f} |", flush=True)  # fmt: skip
    cpu_decode.set_enabled(True)
    print(f"\nload average (1, 5, 15 min): {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f} at the start, "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
