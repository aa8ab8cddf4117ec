"""Paged-KV data movement in Triton: write new rows, gather a sequence's pages, copy blocks.

Same contracts as the torch paths in :mod:`nj_kernels.kv_ops` (layout documented there). Every
kernel takes strides, so views such as ``kv[l, 0]`` work without a copy; block ids are
widened to int64 before they scale a stride, because a whole-model pool passes 2**31
elements.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

# Decoration reads TRITON_INTERPRET, so it is read once here too: a launch works on CUDA, or
# on CPU tensors under the interpreter.
AVAILABLE: bool = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"

# Elements one program moves per step: big enough to stream, small enough for registers.
_CHUNK = 1024


@triton.jit
def _write_kv_kernel(
    k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr, page,
    stride_kt, stride_kh, stride_kd,
    stride_vt, stride_vh, stride_vd,
    stride_kcb, stride_kcs, stride_kch, stride_kcd,
    stride_vcb, stride_vcs, stride_vch, stride_vcd,
    KVH: tl.constexpr,
    D: tl.constexpr,
    BLOCK_E: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    blk = slot // page
    off = slot % page
    e = tl.arange(0, BLOCK_E)
    h = e // D
    d = e % D
    ok = e < KVH * D
    # A negative slot would address memory before the pool: such rows are dropped.
    if slot >= 0:
        k = tl.load(k_ptr + t * stride_kt + h * stride_kh + d * stride_kd, mask=ok)
        kc_off = blk * stride_kcb + off * stride_kcs + h * stride_kch + d * stride_kcd
        tl.store(kc_ptr + kc_off, k, mask=ok)
        v = tl.load(v_ptr + t * stride_vt + h * stride_vh + d * stride_vd, mask=ok)
        vc_off = blk * stride_vcb + off * stride_vcs + h * stride_vch + d * stride_vcd
        tl.store(vc_ptr + vc_off, v, mask=ok)


def write_kv(
    k_cache: torch.Tensor,  # [NB, BS, KVH, D]
    v_cache: torch.Tensor,  # [NB, BS, KVH, D]
    k: torch.Tensor,  # [T, KVH, D]
    v: torch.Tensor,  # [T, KVH, D]
    slots: torch.Tensor,  # [T] int64
) -> None:
    """Write T new key/value rows into their slots, in place (cast to the cache dtype)."""
    _, page, kvh, d = k_cache.shape
    if k.shape[0] == 0:
        return
    # torch casts (a no-op when the model already runs in the cache dtype): its rounding is
    # the torch path's, where the interpreter's fp32 -> bf16 cast truncates.
    k, v = k.to(k_cache.dtype), v.to(v_cache.dtype)
    _write_kv_kernel[(k.shape[0],)](
        k, v, k_cache, v_cache, slots.contiguous(), page,
        *k.stride(), *v.stride(), *k_cache.stride(), *v_cache.stride(),
        KVH=kvh, D=d, BLOCK_E=triton.next_power_of_2(kvh * d),
    )


@triton.jit
def _gather_kv_kernel(
    cache_ptr, bt_ptr, out_ptr, out_len,
    stride_cb, stride_cs, stride_ch, stride_cd,
    stride_btb, stride_btm,
    PAGE: tl.constexpr,
    KVH: tl.constexpr,
    D: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_E: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    pos = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    pos_ok = pos < out_len
    blk = tl.load(bt_ptr + b * stride_btb + (pos // PAGE) * stride_btm, mask=pos_ok, other=0).to(tl.int64)
    e = tl.arange(0, BLOCK_E)
    h = e // D
    d = e % D
    mask = pos_ok[:, None] & (e < KVH * D)[None, :]
    row = blk * stride_cb + (pos % PAGE) * stride_cs
    src = row[:, None] + (h * stride_ch + d * stride_cd)[None, :]
    x = tl.load(cache_ptr + src, mask=mask)
    dst = (b * out_len + pos[:, None]) * (KVH * D) + e[None, :]
    tl.store(out_ptr + dst, x, mask=mask)


def gather_kv(cache: torch.Tensor, block_tables: torch.Tensor, max_len: int) -> torch.Tensor:
    """``[B, max_len, KVH, D]``: each sequence's first ``max_len`` cached rows, in order.

    Like the torch path, the length is capped at what the block table can address, and
    positions past a sequence's end read whatever its padding block holds."""
    _, page, kvh, d = cache.shape
    b, maxb = block_tables.shape
    out_len = min(max_len, maxb * page)
    out = torch.empty((b, out_len, kvh, d), dtype=cache.dtype, device=cache.device)
    if out.numel() == 0:
        return out
    block_e = triton.next_power_of_2(kvh * d)
    block_t = max(1, _CHUNK // block_e)
    _gather_kv_kernel[(b, triton.cdiv(out_len, block_t))](
        cache, block_tables, out, out_len, *cache.stride(), *block_tables.stride(),
        PAGE=page, KVH=kvh, D=d, BLOCK_T=block_t, BLOCK_E=block_e,
    )
    return out


@triton.jit
def _copy_blocks_kernel(
    kv_ptr, src_ptr, dst_ptr,
    stride_l, stride_c, stride_b, stride_s, stride_h, stride_d,
    PAGE: tl.constexpr,
    KVH: tl.constexpr,
    D: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pair = tl.program_id(0)
    layer = tl.program_id(1) // 2
    which = tl.program_id(1) % 2  # 0 keys, 1 values
    src = tl.load(src_ptr + pair).to(tl.int64)
    dst = tl.load(dst_ptr + pair).to(tl.int64)
    e = tl.program_id(2) * BLOCK + tl.arange(0, BLOCK)
    ok = e < PAGE * KVH * D
    s = e // (KVH * D)
    h = (e // D) % KVH
    d = e % D
    base = layer.to(tl.int64) * stride_l + which * stride_c + s * stride_s + h * stride_h + d * stride_d
    x = tl.load(kv_ptr + base + src * stride_b, mask=ok)
    tl.store(kv_ptr + base + dst * stride_b, x, mask=ok)


def copy_blocks(kv: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
    """Copy whole blocks ``src[i] -> dst[i]`` in every layer, keys and values, in place.

    Sources and destinations must not overlap: programs run concurrently, so a block that is
    both read and written would race (compaction moves live blocks into free ones)."""
    if src.numel() == 0:
        return
    layers, _, _, page, kvh, d = kv.shape
    elems = page * kvh * d
    block = min(_CHUNK, triton.next_power_of_2(elems))
    grid = (src.numel(), layers * 2, triton.cdiv(elems, block))
    _copy_blocks_kernel[grid](
        kv, src.to(kv.device).contiguous(), dst.to(kv.device).contiguous(), *kv.stride(),
        PAGE=page, KVH=kvh, D=d, BLOCK=block,
    )
