"""GPU check of the Triton kernels: compare with the torch paths at serving shapes, then time both.

Run from the repository root on a CUDA machine (TRITON_INTERPRET must be unset):

    python -m benchmarks.gpu.kernels_check [--json $OUT/kernels_check.json] [--sweep]

Attention is compared, over each sequence's valid rows, with the torch path run on fp32
copies of the inputs (relative error ‖out − ref‖ / ‖ref‖; the torch path's own error in the
input dtype is printed beside it); the KV kernels must equal the torch paths bit for bit.
Timings are medians of ``triton.testing.do_bench`` (L2 flushed before each rep, launch
overhead included for both paths, no CUDA graphs); GB/s counts the bytes a kernel must move
(KV pages read once, q read, output written). Exits 1 if any check fails.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial

import torch
from triton.testing import do_bench

from nj_kernels import kv_ops, triton_attention, triton_kv
from nj_kernels.paged_attention import paged_attention_torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DEVICE = "cuda"
TOLERANCE = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 3e-5}


@dataclass
class Row:
    name: str
    shape: str
    triton_ms: float
    torch_ms: float
    triton_gbs: float
    error: str
    ok: bool


def bench(fn: Callable[[], object]) -> float:
    return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))


def paged_case(
    args: argparse.Namespace, b: int, nq: int, ctx: list[int], q_lens: list[int], dtype: torch.dtype
) -> tuple[torch.Tensor, ...]:
    """Random q and caches on the GPU; each table lists scattered, distinct blocks."""
    page = args.page
    need = [(c + page - 1) // page for c in ctx]
    num_blocks = sum(need) + sum(need) // 4 + 1
    ids = (torch.randperm(num_blocks - 1, device=DEVICE)[: sum(need)] + 1).int()
    tables = torch.zeros(b, max(need), dtype=torch.int32, device=DEVICE)
    for i, chunk in enumerate(ids.split(need)):
        tables[i, : need[i]] = chunk
    shape = (num_blocks, page, args.kv_heads, args.head_dim)
    return (
        torch.randn(b, nq, args.heads, args.head_dim, device=DEVICE, dtype=dtype),
        torch.randn(shape, device=DEVICE, dtype=dtype),
        torch.randn(shape, device=DEVICE, dtype=dtype),
        tables,
        torch.tensor(ctx, device=DEVICE, dtype=torch.int32),
        torch.tensor(q_lens, device=DEVICE, dtype=torch.int32),
    )


def rel_error(out: torch.Tensor, ref: torch.Tensor, q_lens: list[int]) -> float:
    num = sum(float((out[i, :n].float() - ref[i, :n]).norm() ** 2) for i, n in enumerate(q_lens))
    den = sum(float(ref[i, :n].norm() ** 2) for i, n in enumerate(q_lens))
    return (num / den) ** 0.5


def attention_row(
    args: argparse.Namespace, name: str, b: int, nq: int, ranged: bool, ragged: bool, dtype: torch.dtype
) -> list[Row]:
    lo, hi = max(args.min_ctx, nq), max(args.max_ctx, nq)
    ctx = torch.randint(lo, hi + 1, (b,)).tolist() if ranged else [nq] * b
    q_lens = torch.randint(1, nq + 1, (b,)).tolist() if ragged else [nq] * b
    q, kc, vc, tables, ctx_t, ql_t = paged_case(args, b, nq, ctx, q_lens, dtype)
    scale = args.head_dim**-0.5
    ref = paged_attention_torch(q.float(), kc.float(), vc.float(), tables, ctx_t, ql_t, scale)
    torch_out = paged_attention_torch(q, kc, vc, tables, ctx_t, ql_t, scale)
    kv_bytes = 2 * sum(ctx) * args.kv_heads * args.head_dim * kc.element_size()
    moved = kv_bytes + 2 * q.numel() * q.element_size()
    shape = f"B={b} Q={nq} ctx {min(ctx)}-{max(ctx)}" + (" ragged" if ragged else "")
    rows = []
    configs: list[tuple[int | None, int | None]] = [(None, None)]
    if args.sweep:
        rows_per_tile = nq * args.heads // args.kv_heads  # a smaller tile only adds programs
        configs += [(m, n) for m in (16, 32, 64) for n in (32, 64, 128) if m <= max(16, 2 * rows_per_tile)]
    torch_ms = bench(lambda: paged_attention_torch(q, kc, vc, tables, ctx_t, ql_t, scale))
    for bm, bn in configs:
        out = triton_attention.paged_attention(q, kc, vc, tables, ctx_t, ql_t, scale, block_m=bm, block_n=bn)
        err = rel_error(out, ref, q_lens)
        pad_zero = all(bool((out[i, n:] == 0).all()) for i, n in enumerate(q_lens))
        ok = bool(torch.isfinite(out).all()) and pad_zero and err <= TOLERANCE[dtype]
        run = partial(triton_attention.paged_attention, block_m=bm, block_n=bn)
        ms = bench(lambda: run(q, kc, vc, tables, ctx_t, ql_t, scale))  # noqa: B023 (timed at once)
        knobs = "" if bm is None else f" [m{bm} n{bn}]"
        error = f"rel {err:.1e} (torch {rel_error(torch_out, ref, q_lens):.1e})"
        rows.append(Row(f"{name}{knobs}", shape, ms, torch_ms, moved / ms / 1e6, error, ok))
    return rows


def kv_rows(args: argparse.Namespace, dtype: torch.dtype) -> list[Row]:
    rows = []
    page, kvh, d = args.page, args.kv_heads, args.head_dim
    layers, blocks = args.layers, args.pool_blocks
    kv = torch.randn(layers, 2, blocks, page, kvh, d, device=DEVICE, dtype=dtype)
    elt = kv.element_size()

    t = args.batch * 9  # one verification step of γ = 8
    k = torch.randn(t, kvh, d, device=DEVICE, dtype=dtype)
    v = torch.randn(t, kvh, d, device=DEVICE, dtype=dtype)
    slots = torch.randperm(blocks * page, device=DEVICE)[:t]
    want = kv[0].clone()
    kv_ops.write_kv_torch(want[0], want[1], k, v, slots)
    triton_kv.write_kv(kv[0, 0], kv[0, 1], k, v, slots)
    ok = torch.equal(kv[0], want)
    tri = bench(lambda: triton_kv.write_kv(kv[0, 0], kv[0, 1], k, v, slots))
    ref = bench(lambda: kv_ops.write_kv_torch(kv[0, 0], kv[0, 1], k, v, slots))
    moved = 4 * k.numel() * elt
    rows.append(Row("write_kv", f"T={t}", tri, ref, moved / tri / 1e6, "exact" if ok else "MISMATCH", ok))

    max_len = args.max_ctx
    need = (max_len + page - 1) // page
    tables = torch.randperm(blocks, device=DEVICE)[: args.batch * need].view(args.batch, need).int()
    got = triton_kv.gather_kv(kv[0, 0], tables, max_len)
    ok = torch.equal(got, kv_ops.gather_kv_torch(kv[0, 0], tables, max_len))
    tri = bench(lambda: triton_kv.gather_kv(kv[0, 0], tables, max_len))
    ref = bench(lambda: kv_ops.gather_kv_torch(kv[0, 0], tables, max_len))
    moved = 2 * got.numel() * elt
    shape = f"B={args.batch} len={max_len}"
    rows.append(Row("gather_kv", shape, tri, ref, moved / tri / 1e6, "exact" if ok else "MISMATCH", ok))

    perm = torch.randperm(blocks, device=DEVICE)
    src, dst = perm[: args.moves], perm[args.moves : 2 * args.moves]
    want = kv.clone()
    kv_ops.copy_blocks_torch(want, src, dst)
    triton_kv.copy_blocks(kv, src, dst)
    ok = torch.equal(kv, want)  # whole pool: moved blocks right, every other block untouched
    del want
    tri = bench(lambda: triton_kv.copy_blocks(kv, src, dst))
    ref = bench(lambda: kv_ops.copy_blocks_torch(kv, src, dst))
    moved = 2 * layers * 2 * args.moves * page * kvh * d * elt
    shape = f"L={layers} moves={args.moves}"
    rows.append(Row("copy_blocks", shape, tri, ref, moved / tri / 1e6, "exact" if ok else "MISMATCH", ok))
    return rows


def print_table(title: str, rows: list[Row]) -> list[str]:
    """Print the side-by-side table; returns the names of failed checks."""
    head = f"{'kernel':<26}{'shape':<30}{'triton ms':>10}{'torch ms':>10}{'speedup':>8}{'GB/s':>8}  error"
    print(f"\n{title}\n{head}\n{'-' * len(head)}")
    for r in rows:
        print(f"{r.name:<26}{r.shape:<30}{r.triton_ms:>10.4f}{r.torch_ms:>10.4f}"
              f"{r.torch_ms / r.triton_ms:>7.2f}x{r.triton_gbs:>8.0f}  {r.error}{'' if r.ok else '  FAIL'}")
    failed = [r.name for r in rows if not r.ok]
    print(f"\n{len(rows) - len(failed)}/{len(rows)} checks passed", f"FAILED: {failed}" if failed else "")
    return failed


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--heads", type=int, default=9)
    p.add_argument("--kv-heads", type=int, default=3)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--page", type=int, default=16)
    p.add_argument("--min-ctx", type=int, default=512)
    p.add_argument("--max-ctx", type=int, default=2048)
    p.add_argument("--prefill-chunk", type=int, default=256)
    p.add_argument("--layers", type=int, default=30, help="layers of the pool copy_blocks moves")
    p.add_argument("--pool-blocks", type=int, default=8192)
    p.add_argument("--moves", type=int, default=512)
    p.add_argument("--sweep", action="store_true", help="also time block_m × block_n variants")
    p.add_argument("--json", help="write every row to this file")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("TRITON_INTERPRET=1 is set: unset it to run compiled kernels")
    if not torch.cuda.is_available() or not triton_attention.AVAILABLE:
        raise SystemExit("no CUDA device: this check needs a GPU")
    torch.manual_seed(args.seed)
    dtype = DTYPES[args.dtype]
    b, chunk = args.batch, args.prefill_chunk
    cases = [  # name, batch, Q, contexts drawn from [min, max], ragged query_lens
        ("decode", b, 1, True, False),
        ("decode", 1, 1, True, False),
        ("decode", 4, 1, True, False),
        ("verify γ=3", b, 4, True, False),
        ("verify γ=8", b, 9, True, False),
        ("verify ragged", b, 5, True, True),
        ("prefill chunk", 4, chunk, True, False),
        ("prefill first", 4, chunk, False, False),
        ("prefill ragged", 4, chunk, True, True),
    ]
    rows = [r for case in cases for r in attention_row(args, *case, dtype)]
    if dtype != torch.float32:  # the fp32 kernel (IEEE dot) must stay tight too
        rows += attention_row(args, "decode fp32", 8, 1, True, False, torch.float32)
        rows += attention_row(args, "verify fp32", 8, 5, True, False, torch.float32)
    rows += kv_rows(args, dtype)

    gpu = torch.cuda.get_device_name()
    title = (f"{gpu}, torch {torch.__version__}, {args.dtype}, H={args.heads} KVH={args.kv_heads} "
             f"D={args.head_dim} page={args.page} (timings: medians, one run, noisy)")
    failed = print_table(title, rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": gpu, "args": vars(args), "rows": [asdict(r) for r in rows]}, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
