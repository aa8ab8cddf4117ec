"""Every decoder layer of a Llama-family model over few fp32 CPU rows, in one C call.

The decode path of the CPU engine: a batch-1 decode row, a speculative verification of γ+1
rows, up to ``max_rows()`` decode rows or prompt rows. Run op by op from torch, a layer is ~15
small ops (norms, rotary, the KV write, a gather of the pages and SDPA, SiLU, residuals), 5-20
µs of dispatch each; at batch 1 they cost SmolLM2-135M 8-20 ms a forward on top of the 28-30
ms its 538 MB of weights take to read here. ``cpu_decode.c`` runs the whole stack of layers in
one call: the products through the skinny kernel (``skinny_linear.c``), attention reading the
paged cache in place, everything else on rows that stay in cache. Batch 1 then runs at
1.11-1.18x the read floor (benchmarks/floor_bench.py, docs/benchmarks/history).

Every row's output depends only on that row (its input, its position, the keys and values its
attention reads), never on the other rows or their number: a verification row computes
exactly what a decode row at the same position computes. The arithmetic is fp32 and follows
transformers; sums run in another order than torch's, so the two paths agree to rounding.

Which weights it takes (``DecodeLayers.supports``): plain row-major fp32 CPU tensors, and, for
the four matrices of a layer, GGUF blocks (``QuantWeight``: Q4_1, Q8_0, ... as the file stores
them), multiplied by ``quant_linear.c``'s own function through its address, so each product is
the very code (and bits) the op-by-op path runs. A model whose matrices are all blocks
(``DecodeLayers.any_rows``) runs every forward here, whatever its row count: the block product
is batch-invariant for every row count, so a position's logits stay the same bits whether it
is decoded alone, verified with drafts or prefilled in a chunk of any size (a mix of this path
and the op-by-op one would round some positions differently). A model holding another weight
type (a ``StackedWeight`` of mixed types, a bf16 tensor) runs its layers op by op, with every
product through ``cpu_linear.linear(x, weight, bias)``.

``NIGHTJAR_FUSED_DECODE``: ``auto`` (default: on where the kernels build), ``off``.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from nj_kernels import cpu_linear, quant_linear
from nj_kernels.quant_linear import QuantWeight

# Field order of nj_layer in cpu_decode.c: the weights of one layer, None where absent.
LAYER_FIELDS = (
    "input_norm", "qkv", "qkv_bias", "qk_norm", "o", "o_bias", "post_norm",
    "gate_up", "gate_up_bias", "down", "down_bias",
)  # fmt: skip
REQUIRED = ("input_norm", "qkv", "o", "post_norm", "gate_up", "down")
MATRICES = ("qkv", "o", "gate_up", "down")  # nj_matrix fields: fp32 tensors or GGUF blocks
MAX_ROWS_ONE_THREAD = 64
MAX_HEAD_DIM = 512  # NJ_MAX_HEAD_DIM
MAX_HEADS = 1024  # NJ_MAX_HEADS
_ERRORS = {
    2: "a position outside the rotary table or its block table",
    3: "a slot outside the cache",
    4: "a block id outside the cache",
    5: "rows not covered by exactly one group",
    6: "unsupported dimensions",
    7: "a weight type the block kernel does not read",
}


class _Matrix(ctypes.Structure):
    """nj_matrix: fp32 floats (fn None) or GGUF blocks of a type, multiplied by fn."""

    _fields_ = [
        ("w", ctypes.c_void_p),
        ("fn", ctypes.c_void_p),
        ("type", ctypes.c_int64),
        ("row_bytes", ctypes.c_int64),
    ]


class _Layer(ctypes.Structure):
    _fields_ = [(name, _Matrix if name in MATRICES else ctypes.c_void_p) for name in LAYER_FIELDS]


class _Dims(ctypes.Structure):
    _fields_ = [
        *[(name, ctypes.c_int64) for name in (
            "num_layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate",
            "num_blocks", "block_size", "rope_positions")],
        ("eps", ctypes.c_float),
        ("scale", ctypes.c_float),
        ("threads", ctypes.c_int32),
    ]  # fmt: skip


class _Group(ctypes.Structure):
    _fields_ = [
        ("row_start", ctypes.c_int64),
        ("num_seqs", ctypes.c_int64),
        ("num_queries", ctypes.c_int64),
        ("table_stride", ctypes.c_int64),
        ("tables", ctypes.c_void_p),
    ]


class PagedRows(Protocol):
    """Rows ``row_start ..`` of the batch: ``num_seqs`` sequences of ``num_queries`` consecutive
    rows each, sequence b's pages in ``block_tables[b]`` (int32). ``AttentionGroup`` is one."""

    row_start: int
    num_seqs: int
    num_queries: int
    block_tables: torch.Tensor


@dataclass(frozen=True)
class Dims:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    eps: float
    scale: float  # attention's softmax scale


_enabled = os.environ.get("NIGHTJAR_FUSED_DECODE", "auto") != "off"
_bound: set[int] = set()  # ids of the libraries whose nj_decode_layers has its signature set


def _load() -> ctypes.CDLL | None:
    lib = cpu_linear.library()
    if lib is not None and id(lib) not in _bound:
        fn = lib.nj_decode_layers
        ptr, i32 = ctypes.c_void_p, ctypes.c_int
        fn.argtypes = [ptr, ptr, ptr, i32, ptr, ptr, ptr, ptr, ptr, i32, ptr]
        fn.restype = ctypes.c_int
        _bound.add(id(lib))
    return lib


def available() -> bool:
    """Whether the kernels are built here (whatever ``set_enabled`` says)."""
    return _load() is not None


def set_enabled(flag: bool) -> None:
    """Turn the fused path on or off (benchmarks and tests compare both in one run)."""
    global _enabled
    _enabled = flag


def max_rows() -> int:
    """Forwards of at most this many rows take the fused path (0: none do). With one torch
    thread, 64: SmolLM2 at context 200, the fused forward against the op-by-op one (whose
    products of more than 24 rows go to the BLAS) took 0.55-0.7x its time at 24-64 decode rows
    and 0.86x for a 64-row prompt chunk, and about the same at 96-128 rows (2026-12-04). With
    several threads, the skinny kernel's limit: the BLAS then splits larger products across
    cores, which the one-threaded fused path does not. ``NIGHTJAR_FUSED_DECODE=off`` (or
    ``NIGHTJAR_SKINNY=off``) turns it off."""
    if not _enabled or cpu_linear.max_rows() == 0:
        return 0
    return MAX_ROWS_ONE_THREAD if torch.get_num_threads() == 1 else cpu_linear.max_rows()


class DecodeLayers:
    """One model's layers, bound for the fused path. It keeps a reference to every weight, so
    the pointers it hands to C stay valid whatever happens to the model's attributes; a model
    whose weights move builds a new one."""

    def __init__(self, dims: Dims, layers: Sequence[Mapping[str, object]]) -> None:
        if (
            not layers or dims.head_dim > MAX_HEAD_DIM or dims.head_dim % 2
            or dims.heads % dims.kv_heads or dims.heads > MAX_HEADS
        ):  # fmt: skip
            raise ValueError(f"the fused decode path does not take these dimensions: {dims}")
        self.dims = dims
        self._tensors: list[object] = []  # every weight handed to C, kept alive
        self._layers = (_Layer * len(layers))()
        d = dims
        shapes = {  # what the C code reads each matrix as: [N, K]
            "qkv": ((d.heads + 2 * d.kv_heads) * d.head_dim, d.hidden), "o": (d.hidden, d.heads * d.head_dim),
            "gate_up": (2 * d.intermediate, d.hidden), "down": (d.hidden, d.intermediate),
        }  # fmt: skip
        blocks = 0
        for i, layer in enumerate(layers):
            for name in LAYER_FIELDS:
                t = layer.get(name)
                if t is None:
                    if name in REQUIRED:
                        raise ValueError(f"layer {i} has no {name}")
                    continue
                if isinstance(t, QuantWeight) and name in MATRICES and self.supports(t):
                    lib = t.lib or quant_linear.library()
                    assert lib is not None  # supports(t)
                    fn = ctypes.cast(lib.quant_linear, ctypes.c_void_p).value
                    setattr(self._layers[i], name, _Matrix(t.data.data_ptr(), fn, t.qtype, t.data.shape[1]))
                    blocks += 1
                elif isinstance(t, torch.Tensor) and self.supports(t):
                    ptr = t.data_ptr()
                    setattr(self._layers[i], name, _Matrix(ptr, None, 0, 0) if name in MATRICES else ptr)
                else:
                    raise ValueError(f"layer {i}'s {name}: not a contiguous fp32 CPU tensor, nor GGUF blocks")
                if name in shapes and tuple(t.shape) != shapes[name]:
                    raise ValueError(f"layer {i}'s {name} is {tuple(t.shape)}, not {shapes[name]}")
                self._tensors.append(t)
        self.num_layers = len(layers)
        # Every matrix is blocks: the products are batch-invariant for any row count, so the
        # model runs all its forwards here (see the module's docstring).
        self.any_rows = blocks == len(MATRICES) * len(layers)

    @staticmethod
    def supports(weight: object) -> bool:
        """Whether the fused path can read this weight: a plain contiguous fp32 CPU tensor, or
        (as a layer's matrix) GGUF blocks whose block kernel is built here."""
        if isinstance(weight, QuantWeight):
            return weight.lib is not None or quant_linear.available()
        return (
            type(weight) is torch.Tensor
            and weight.dtype == torch.float32
            and weight.device.type == "cpu"
            and weight.is_contiguous()
        )

    def run(
        self,
        hidden: torch.Tensor,  # [T, hidden] the rows' inputs
        positions: torch.Tensor,  # [T] int64
        slots: torch.Tensor,  # [T] int64: the cache slot each row's key and value go to
        kv: torch.Tensor,  # [layers, 2, num_blocks, block_size, kv_heads, head_dim] fp32
        groups: Sequence[PagedRows],
        cos: torch.Tensor,  # [P, head_dim / 2] fp32: rotary of positions 0..P-1
        sin: torch.Tensor,
    ) -> torch.Tensor:
        """The last layer's output rows (before the final norm); writes every row's keys and
        values into ``kv``. Raises ``ValueError`` for inputs out of range (checked in C before
        anything is written)."""
        lib = _load()
        if lib is None:
            raise RuntimeError("the CPU kernels are not available here")
        d = self.dims
        t = hidden.shape[0]
        if (
            hidden.dim() != 2 or hidden.shape[1] != d.hidden or hidden.dtype != torch.float32
            or kv.dtype != torch.float32 or not kv.is_contiguous() or kv.dim() != 6
            or tuple(kv.shape[i] for i in (0, 1, 4, 5)) != (self.num_layers, 2, d.kv_heads, d.head_dim)
            or positions.shape != (t,) or slots.shape != (t,)
            or cos.shape != sin.shape or cos.dim() != 2 or cos.shape[1] != d.head_dim // 2
        ):  # fmt: skip
            raise ValueError("fused decode: inputs of the wrong shape or type")
        out = hidden.to(torch.float32, copy=True).contiguous()
        positions = positions.to(torch.int64).contiguous()
        slots = slots.to(torch.int64).contiguous()
        cos, sin = cos.to(torch.float32).contiguous(), sin.to(torch.float32).contiguous()
        tables = [g.block_tables.to(torch.int32).contiguous() for g in groups]
        cg = (_Group * max(1, len(groups)))()
        for i, (g, tb) in enumerate(zip(groups, tables, strict=True)):
            cg[i] = _Group(g.row_start, g.num_seqs, g.num_queries, tb.shape[1], tb.data_ptr())
        dims = _Dims(self.num_layers, d.hidden, d.heads, d.kv_heads, d.head_dim, d.intermediate,
                     kv.shape[2], kv.shape[3], cos.shape[0], d.eps, d.scale,
                     torch.get_num_threads())  # fmt: skip
        rc = lib.nj_decode_layers(
            ctypes.byref(dims), self._layers, out.data_ptr(), t, positions.data_ptr(), slots.data_ptr(),
            cos.data_ptr(), sin.data_ptr(), cg, len(groups), kv.data_ptr(),
        )  # fmt: skip
        if rc == 1:
            raise MemoryError("fused decode: out of memory")
        if rc:
            raise ValueError(f"fused decode: {_ERRORS.get(rc, rc)}")
        return out
