"""Row-invariant causal attention over the paged KV cache on CPU (``cpu_attention.c``).

torch's ``scaled_dot_product_attention`` is not batch-invariant: the same query row attended in
a call of 1 row and in a call of γ+1 rows (or beside sequences that pad the keys further) can
come out a few ulps apart, because its matrix products take paths that depend on the row
count (measured: head_dim 64 with two query heads per KV head differs on every row). The C
kernel computes each (row, head) by one fixed sequence of operations over exactly the keys the
row sees, so its output depends on nothing else: with the GGUF block kernel's linear layers
(also row-invariant) a position's logits are the same bits whether it was decoded alone,
verified with drafts, or prefilled in a chunk, which is what keeps greedy speculation exact
against the same weights. Compiled on first use like the other kernels (``cc -O3
-march=native``, cached by source and machine).

The engine uses it for a model served from GGUF blocks (``ModelRunner.row_invariant``); the
fp32 path keeps SDPA (its reference is transformers', which this rounds differently).
"""

from __future__ import annotations

import ctypes
import logging
import platform
from pathlib import Path

import torch

from nj_kernels.cbuild import compile_cached

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("cpu_attention.c")
FLAGS = ["-O3", "-march=native", "-shared", "-fPIC"]
MAX_GROUP, MAX_HEAD_DIM = 16, 256  # query heads per KV head, head width (the kernel's limits)

_lib: ctypes.CDLL | None = None
_tried = False


def build(cache_dir: Path | None = None, flags: list[str] | None = None) -> Path:
    return compile_cached(SOURCE, flags or FLAGS, cache_dir)


def bind(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    p, i, f = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
    # q, q row stride, cache, tables, ctx, out, B, NQ, H, KVH, D, NB, BS, MAXB, scale
    lib.paged_attention_rows.argtypes = [p, ctypes.c_long, p, p, p, p, i, i, i, i, i, i, i, i, f]
    lib.paged_attention_rows.restype = ctypes.c_int
    return lib


def _load() -> ctypes.CDLL | None:
    global _lib, _tried
    if _tried:
        return _lib
    _tried = True
    if platform.machine() not in ("x86_64", "AMD64"):
        return None
    try:
        _lib = bind(build())
    except (RuntimeError, OSError) as exc:
        log.warning("row-invariant attention kernel unavailable (torch's SDPA instead): %s", exc)
        return None
    return _lib


def available() -> bool:
    return _load() is not None


def supports(num_heads: int, num_kv_heads: int, head_dim: int) -> bool:
    return num_heads // num_kv_heads <= MAX_GROUP and head_dim <= MAX_HEAD_DIM and available()


def paged_attention_rows(
    q: torch.Tensor,  # [B * NQ, H, D] fp32 (rows may be strided; heads and dims contiguous)
    kv_layer: torch.Tensor,  # [2, NB, BS, KVH, D] fp32, contiguous
    block_tables: torch.Tensor,  # [B, MAXB] int32
    context_lens: torch.Tensor,  # [B] int32: tokens cached including this step's rows
    num_queries: int,
    scale: float,
    lib: ctypes.CDLL | None = None,
) -> torch.Tensor:
    """Causal attention of each row over its own sequence's keys; returns ``[B * NQ, H, D]``."""
    lib = lib or _load()
    if lib is None:
        raise RuntimeError("the row-invariant attention kernel is not available here")
    t, h, d = q.shape
    _, nb, bs, kvh, _ = kv_layer.shape
    if q.dtype != torch.float32 or kv_layer.dtype != torch.float32 or q.stride(2) != 1 or q.stride(1) != d:
        raise ValueError("paged_attention_rows takes fp32 rows of contiguous heads")
    kv_layer = kv_layer.contiguous()
    tables = block_tables.to(torch.int32).contiguous()
    ctx = context_lens.to(torch.int32).contiguous()
    b = tables.shape[0]
    if b * num_queries != t:
        raise ValueError(f"{t} rows are not {b} sequences of {num_queries}")
    out = torch.empty(t, h, d, dtype=torch.float32)
    rc = lib.paged_attention_rows(
        q.data_ptr(), q.stride(0), kv_layer.data_ptr(), tables.data_ptr(), ctx.data_ptr(), out.data_ptr(),
        b, num_queries, h, kvh, d, nb, bs, tables.shape[1], scale,
    )  # fmt: skip
    if rc != 0:
        raise RuntimeError(f"paged_attention_rows failed ({rc}): {h} heads over {kvh}, width {d}")
    return out
