"""GGUF weight matrices kept in their own encoding on CPU, multiplied straight from their blocks.

A ``QuantWeight`` is one ``[N, K]`` matrix as GGUF stores it: row ``n`` is ``K / block``
blocks of the tensor's type (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K), so a Q4_1 matrix
costs 0.625 bytes a weight instead of fp32's 4. It knows its own product (``linear``), its own
embedding lookup (``embedding``) and its own dequantisation; the model's linear layers reach it
through ``nj_kernels.cpu_linear.linear``, which hands any ``QuantWeight`` to it.

The product is ``quant_linear.c`` (compiled on first use like the skinny kernel: ``cc -O3
-march=native -ffp-contract=off``, cached by source and machine; AVX-512 where the CPU has it,
else AVX2 + FMA + F16C):

- dequantised values equal ``gguf.quants.dequantize`` bit for bit (same fp32 operations in the
  same order; no fused multiply-add in the dequantisation);
- a row's result does not depend on how many rows are in the call, for every row count: few
  rows dequantise each block in registers, many rows dequantise a tile of weight rows to fp32
  once and accumulate over it in the same order. Speculation's exactness against the same
  weights rests on this: a verification of γ+1 rows gives each position the bits a decode
  step would. Both paths also equal ``skinny_linear`` on the dequantised matrix, bit for bit.

Where the kernel cannot be built (no compiler, not x86-64 with AVX2/FMA/F16C) ``available()``
is False and the loader dequantises the file to fp32 instead (today's path).
"""

from __future__ import annotations

import ctypes
import logging
import platform
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from nj_kernels.cbuild import compile_cached

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("quant_linear.c")
FLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-pthread", "-shared", "-fPIC"]

# GGML type id -> (name, elements per block, bytes per block): the types the kernel reads.
TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    30: ("BF16", 1, 2),
    8: ("Q8_0", 32, 34),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    12: ("Q4_K", 256, 144),
    14: ("Q6_K", 256, 210),
}
TYPE_IDS = {name: t for t, (name, _, _) in TYPES.items()}

FEW_ROWS = 8  # up to this many rows the kernel dequantises in registers, on one thread (MBR2 on AVX-512)

_lib: ctypes.CDLL | None = None
_tried = False


def build(cache_dir: Path | None = None, flags: list[str] | None = None) -> Path:
    """Compile the kernel (once per source, flags and machine); ``flags`` replaces the default
    (tests build the AVX2 variant on an AVX-512 machine with ``-mno-avx512f``)."""
    return compile_cached(SOURCE, flags or FLAGS, cache_dir)


def bind(path: Path) -> ctypes.CDLL:
    """Load a built kernel and declare its functions."""
    lib = ctypes.CDLL(str(path))
    i, p, n = ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t
    # type, w, row bytes, x, bias, y, M, N, K, threads
    lib.quant_linear.argtypes = [i, p, n, p, p, p, i, i, i, i]
    lib.quant_linear.restype = ctypes.c_int
    lib.quant_dequant_rows.argtypes = [i, p, n, p, i, i, p]  # type, w, row bytes, ids, n, K, out
    lib.quant_dequant_rows.restype = ctypes.c_int
    lib.quant_vector_width.argtypes = []
    lib.quant_vector_width.restype = ctypes.c_int
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
        log.warning("GGUF block kernel unavailable (GGUF files are dequantised to fp32 instead): %s", exc)
        return None
    return _lib


def _kernel() -> ctypes.CDLL:
    lib = _lib if _tried else _load()
    if lib is None:
        raise RuntimeError("the GGUF block kernel is not available here")
    return lib


def available() -> bool:
    return _load() is not None


def library() -> ctypes.CDLL | None:
    """The default compiled kernel (built on first use), or None where it cannot be built: the
    fused decode path calls its ``quant_linear`` by address (``quant_linear.h``)."""
    return _load()


def vector_width() -> int:
    """Lanes of the built kernel's vectors: 16 (AVX-512) or 8 (AVX2); 0 when unavailable."""
    lib = _load()
    return int(lib.quant_vector_width()) if lib is not None else 0


@dataclass(eq=False)
class QuantWeight:
    """An ``[N, K]`` weight matrix in a GGUF encoding: ``data`` is ``[N, row_bytes]`` uint8,
    row-major and contiguous. ``lib`` pins the compiled kernel (None: the default one)."""

    qtype: int
    shape: tuple[int, int]
    data: torch.Tensor
    lib: ctypes.CDLL | None = None

    def __post_init__(self) -> None:
        if self.qtype not in TYPES:
            raise ValueError(f"GGUF type {self.qtype} is not read from blocks (types: {self.type_names()})")
        _, block, size = TYPES[self.qtype]
        n, k = self.shape
        if k % block:
            raise ValueError(f"a {self.type_name} row of {k} weights is not whole blocks of {block}")
        if self.data.dtype != torch.uint8 or tuple(self.data.shape) != (n, k // block * size):
            raise ValueError(f"{self.type_name} [{n}, {k}] needs [{n}, {k // block * size}] uint8 bytes")
        self.data = self.data.contiguous()
        # What each product passes the kernel: type, blocks, bytes a row, N, K.
        self._call = (self.qtype, self.data.data_ptr(), k // block * size, n, k)

    @staticmethod
    def type_names() -> str:
        return ", ".join(name for name, _, _ in TYPES.values())

    @classmethod
    def from_numpy(cls, qtype: int, shape: tuple[int, int], raw: np.ndarray) -> QuantWeight:
        """From a GGUF tensor's raw data (any dtype; its bytes are taken as they are, copied)."""
        n = shape[0]
        data = torch.from_numpy(np.ascontiguousarray(raw).view(np.uint8).reshape(n, -1).copy())
        return cls(qtype, shape, data)

    @property
    def type_name(self) -> str:
        return TYPES[self.qtype][0]

    @property
    def nbytes(self) -> int:
        return int(self.data.numel())

    def _kernel(self) -> ctypes.CDLL:
        return self.lib or _kernel()

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x [M, K] @ W^T (+ bias)`` in fp32, from the blocks; M may be anything (0 too).
        (Called ~120 times a decode step of SmolLM2: kept lean.)"""
        qtype, ptr, row_bytes, n, k = self._call
        if x.dtype != torch.float32 or not x.is_cpu or x.dim() != 2 or x.shape[1] != k:
            raise ValueError(f"{self.type_name} [{n}, {k}] times x {tuple(x.shape)} {x.dtype} {x.device}")
        if not x.is_contiguous():
            x = x.contiguous()
        if bias is not None:
            bias = bias.to(torch.float32).contiguous()
            if tuple(bias.shape) != (n,):
                raise ValueError(f"bias {tuple(bias.shape)} for {n} outputs")
        m = x.shape[0]
        y = torch.empty(m, n, dtype=torch.float32)
        if m == 0:
            return y
        rc = (self.lib or _kernel()).quant_linear(
            qtype, ptr, row_bytes, x.data_ptr(), None if bias is None else bias.data_ptr(), y.data_ptr(),
            m, n, k, torch.get_num_threads() if m > FEW_ROWS else 1,
        )  # fmt: skip
        if rc != 0:
            raise RuntimeError(f"quant_linear failed ({rc}) on {self.type_name} [{n}, {k}]")
        return y

    def embedding(self, ids: torch.Tensor) -> torch.Tensor:
        """The dequantised rows ``ids`` (any shape of int64): ``[*ids.shape, K]`` fp32."""
        n, k = self.shape
        flat = ids.reshape(-1).to(torch.int64).contiguous()
        if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= n):
            raise IndexError(f"row ids out of range for {n} rows")
        out = torch.empty(flat.numel(), k, dtype=torch.float32)
        if flat.numel():
            rc = self._kernel().quant_dequant_rows(
                self.qtype, self.data.data_ptr(), self.data.shape[1], flat.data_ptr(), flat.numel(), k,
                out.data_ptr(),
            )  # fmt: skip
            if rc != 0:
                raise RuntimeError(f"quant_dequant_rows failed ({rc})")
        return out.view(*ids.shape, k)

    def dequantize(self) -> torch.Tensor:
        """The whole matrix in fp32 (tests and the rows a drafter copies; never the served path)."""
        n, k = self.shape
        out = torch.empty(n, k, dtype=torch.float32)
        if n:
            rc = self._kernel().quant_dequant_rows(
                self.qtype, self.data.data_ptr(), self.data.shape[1], None, n, k, out.data_ptr()
            )
            if rc != 0:
                raise RuntimeError(f"quant_dequant_rows failed ({rc})")
        return out

    def select_rows(self, index: torch.Tensor) -> QuantWeight:
        """The rows ``index`` (in that order), still in their encoding."""
        data = self.data.index_select(0, index.to(torch.int64))
        return QuantWeight(self.qtype, (int(data.shape[0]), self.shape[1]), data, self.lib)

    @staticmethod
    def cat(parts: list[QuantWeight]) -> QuantWeight:
        """Rows of several matrices of one type and width stacked (fused q/k/v, gate/up)."""
        first = parts[0]
        if any(p.qtype != first.qtype or p.shape[1] != first.shape[1] for p in parts):
            raise ValueError("only matrices of one GGUF type and width can be stacked")
        data = torch.cat([p.data for p in parts], dim=0)
        return QuantWeight(first.qtype, (int(data.shape[0]), first.shape[1]), data, first.lib)


@dataclass(eq=False)
class StackedWeight:
    """Matrices of different GGUF types stacked by rows (a fused q/k/v whose v is Q6_K and q/k
    Q4_K, as llama.cpp's mixed quantisations make them): each part multiplies its own rows."""

    parts: list[QuantWeight]

    @property
    def shape(self) -> tuple[int, int]:
        return sum(p.shape[0] for p in self.parts), self.parts[0].shape[1]

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        outs, start = [], 0
        for p in self.parts:
            n = p.shape[0]
            outs.append(p.linear(x, None if bias is None else bias[start : start + n]))
            start += n
        return torch.cat(outs, dim=1)


# What a model's weight matrix may be: a tensor (the fp32/bf16 path) or GGUF blocks.
Weight = torch.Tensor | QuantWeight | StackedWeight


def stack(parts: list[QuantWeight]) -> QuantWeight | StackedWeight:
    """Matrices stacked by rows: one QuantWeight when they share a type, else a StackedWeight."""
    if all(p.qtype == parts[0].qtype for p in parts):
        return QuantWeight.cat(parts)
    return StackedWeight(parts)
