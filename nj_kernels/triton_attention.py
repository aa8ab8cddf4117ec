"""Paged attention in Triton: a flash-attention style online softmax over a sequence's pages.

Same contract as :func:`nj_kernels.paged_attention.paged_attention_torch` (decode, speculative
verification and chunked prefill in one kernel; causal; GQA). One program handles one
(sequence, kv head, query tile): the tile flattens (query row, head of the kv group) into its
M dimension, so the heads sharing a kv head share every key/value page load (a decode step
with 3 heads per kv head reads each page once, not three times).

Rows past a sequence's query_len are written as zeros (the torch path leaves junk there;
the contract only promises junk, zeros keep it finite).
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

# Decoration reads TRITON_INTERPRET, so it is read once here too: a launch works on CUDA, or
# on CPU tensors under the interpreter.
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
AVAILABLE: bool = torch.cuda.is_available() or _INTERPRET

# The interpreter keeps bfloat16 as raw uint16 and its tl.dot multiplies the bit patterns
# (triton-lang/triton#11584), so there the products run in fp32 on the same bf16-rounded
# values; compiled kernels feed the tensor cores in the input dtype.
_DOT_DTYPE = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}
if _INTERPRET:
    _DOT_DTYPE[torch.bfloat16] = tl.float32

_LOG2E = 1.0 / math.log(2.0)


@triton.jit
def _paged_attention_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, ctx_ptr, qlen_ptr, out_ptr,
    qk_scale, num_q, head_dim,
    stride_qb, stride_qq, stride_qh, stride_qd,
    stride_kb, stride_ks, stride_kh, stride_kd,
    stride_vb, stride_vs, stride_vh, stride_vd,
    stride_btb, stride_btm,
    stride_ob, stride_oq, stride_oh, stride_od,
    GROUP: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    tile = tl.program_id(2)
    ctx = tl.load(ctx_ptr + b).to(tl.int32)
    qlen = tl.load(qlen_ptr + b).to(tl.int32)
    rows_valid = tl.minimum(qlen, num_q)

    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    qi = rows // GROUP
    head = kvh * GROUP + rows % GROUP
    row_ok = qi < rows_valid
    q_pos = ctx - qlen + qi
    d = tl.arange(0, BLOCK_D)
    d_ok = d < head_dim

    q_off = b * stride_qb + qi[:, None] * stride_qq + head[:, None] * stride_qh + d[None, :] * stride_qd
    q = tl.load(q_ptr + q_off, mask=row_ok[:, None] & d_ok[None, :], other=0.0).to(DOT_DTYPE)

    # Causal: the tile needs keys up to its last valid row's position, and none at all when
    # every row is padding.
    first_qi = (tile * BLOCK_M) // GROUP
    last_qi = tl.minimum((tile * BLOCK_M + BLOCK_M - 1) // GROUP, rows_valid - 1)
    kv_end = tl.where(first_qi < rows_valid, ctx - qlen + last_qi + 1, 0)

    # A finite floor keeps exp2(m_old - m_new) defined for rows that see no key yet.
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    bt_row = bt_ptr + b * stride_btb
    for start in range(0, kv_end, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        pos_ok = pos < kv_end
        blk = tl.load(bt_row + (pos // PAGE) * stride_btm, mask=pos_ok, other=0).to(tl.int64)
        in_page = pos % PAGE
        kv_mask = pos_ok[:, None] & d_ok[None, :]
        k_off = blk[:, None] * stride_kb + in_page[:, None] * stride_ks + kvh * stride_kh
        k = tl.load(k_ptr + k_off + d[None, :] * stride_kd, mask=kv_mask, other=0.0).to(DOT_DTYPE)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        visible = (pos[None, :] <= q_pos[:, None]) & row_ok[:, None] & pos_ok[None, :]
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v_off = blk[:, None] * stride_vb + in_page[:, None] * stride_vs + kvh * stride_vh
        v = tl.load(v_ptr + v_off + d[None, :] * stride_vd, mask=kv_mask, other=0.0)
        # p is rounded to the value dtype first, as a tensor-core product would see it.
        p_in = p.to(v.dtype).to(DOT_DTYPE)
        acc = acc * alpha[:, None] + tl.dot(p_in, v.to(DOT_DTYPE), input_precision=PRECISION)
        m_i = m_new

    out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    o_off = b * stride_ob + qi[:, None] * stride_oq + head[:, None] * stride_oh + d[None, :] * stride_od
    tl.store(out_ptr + o_off, out.to(out_ptr.dtype.element_ty), mask=(qi < num_q)[:, None] & d_ok[None, :])


def _pow2_at_least(n: int, floor: int) -> int:
    return max(floor, triton.next_power_of_2(n))


def paged_attention(
    q: torch.Tensor,  # [B, Q, H, D]
    k_cache: torch.Tensor,  # [NB, BS, KVH, D]
    v_cache: torch.Tensor,  # [NB, BS, KVH, D]
    block_tables: torch.Tensor,  # [B, MAXB] int32
    context_lens: torch.Tensor,  # [B] int: cached tokens including this step's rows
    query_lens: torch.Tensor,  # [B] int: valid rows of q (≤ Q)
    scale: float,
    *,
    block_m: int | None = None,
    block_n: int | None = None,
) -> torch.Tensor:
    """Causal paged attention; returns ``[B, Q, H, D]`` in q's dtype (fp32 accumulation).

    ``block_m`` (flattened query-row × head tile) and ``block_n`` (keys per step) are tuning
    knobs, powers of two ≥ 16; tests shrink them to exercise tiling on tiny shapes."""
    b, nq, h, d = q.shape
    _, page, kvh, dk = k_cache.shape
    if h % kvh or dk != d or v_cache.shape != k_cache.shape:
        raise ValueError(f"bad shapes: q {tuple(q.shape)}, caches {tuple(k_cache.shape)}")
    group = h // kvh
    out = torch.empty((b, nq, h, d), dtype=q.dtype, device=q.device)
    if out.numel() == 0:
        return out
    bm = block_m or min(64, _pow2_at_least(nq * group, 16))
    bn = block_n or 64
    grid = (b, kvh, triton.cdiv(nq * group, bm))
    _paged_attention_kernel[grid](
        q, k_cache, v_cache, block_tables, context_lens.contiguous(), query_lens.contiguous(), out,
        scale * _LOG2E, nq, d,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *block_tables.stride(), *out.stride(),
        GROUP=group, PAGE=page, BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=_pow2_at_least(d, 16),
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        DOT_DTYPE=_DOT_DTYPE[q.dtype],
        num_warps=4,
    )
    return out
