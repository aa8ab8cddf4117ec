"""The GGUF block kernel (nj_kernels/quant_linear): per type, dequantised values equal the gguf
package's own dequantisation bit for bit; the product equals the skinny fp32 kernel on the
dequantised matrix bit for bit (same accumulation order) and the float64 product to rounding;
a row's result is the same bits whatever the number of rows (1..64: the in-register paths and
the tiled one) and wherever it sits in the batch. Every check runs on the build for this CPU
and on the AVX2 build (``-mno-avx512f``), the path machines without AVX-512 take."""

from __future__ import annotations

import ctypes
import platform
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as Q

from nj_kernels import cbuild, cpu_linear, quant_linear
from nj_kernels.quant_linear import QuantWeight, StackedWeight, stack
from tests.worker.engine.gguf_file import QUANTISABLE, random_kquant_blocks

pytestmark = pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64") or not quant_linear.available(),
    reason="the block kernel needs an x86-64 CPU with AVX2/FMA/F16C and a C compiler",
)

TYPES = [*QUANTISABLE, Q.Q4_K, Q.Q6_K]
AVX2 = ["-O3", "-march=native", "-mno-avx512f", "-ffp-contract=off", "-pthread", "-shared", "-fPIC"]


@pytest.fixture(scope="module", params=["native", "avx2"])
def kernels(request: pytest.FixtureRequest) -> Libs:
    """(block kernel, skinny fp32 kernel) built for one instruction set."""
    if request.param == "native":
        return quant_linear.bind(quant_linear.build()), ctypes.CDLL(str(cpu_linear.build()))
    skinny_flags = ["-O3", "-march=native", "-mno-avx512f", "-shared", "-fPIC"]
    skinny = ctypes.CDLL(str(cbuild.compile_cached(cpu_linear.SOURCE, skinny_flags)))
    return quant_linear.bind(quant_linear.build(flags=AVX2)), skinny


Libs = tuple[ctypes.CDLL, ctypes.CDLL]


def skinny(lib: ctypes.CDLL, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    fn = lib.skinny_linear
    fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 3
    x, w = x.contiguous(), w.contiguous()
    y = torch.empty(x.shape[0], w.shape[0])
    b = None if bias is None else bias.data_ptr()
    fn(x.data_ptr(), w.data_ptr(), b, y.data_ptr(), x.shape[0], w.shape[0], w.shape[1])
    return y


def synthetic(qtype: Q, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """``[rows, bytes]`` of a GGUF tensor: gguf.quants' own quantisation of varied values
    (zeros, tiny, large, one sign) where it can quantise the type, else random blocks."""
    rng = np.random.default_rng(seed)
    if qtype in (Q.Q4_K, Q.Q6_K):
        return random_kquant_blocks(qtype, rows, cols, rng)
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    w[0] = 0.0  # an all-zero row: zero scales
    if rows > 2:
        w[1] *= 1e-6  # tiny values: f16 scales near their subnormal range
        w[2] = np.abs(w[2]) * 300  # large, all positive
    raw = gguf.quants.quantize(w, qtype)
    return np.ascontiguousarray(raw).view(np.uint8).reshape(rows, -1)


def weight(qtype: Q, rows: int, cols: int, lib: ctypes.CDLL | None = None, seed: int = 0) -> QuantWeight:
    w = QuantWeight.from_numpy(int(qtype), (rows, cols), synthetic(qtype, rows, cols, seed))
    w.lib = lib
    return w


def reference(w: QuantWeight) -> torch.Tensor:
    values = gguf.quants.dequantize(w.data.numpy(), Q(w.qtype))
    return torch.from_numpy(np.array(values, dtype=np.float32).reshape(w.shape))


def cols_for(qtype: Q) -> list[int]:
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    return [512, 768] if block == 256 else [32, 576, 1536] if block == 32 else [5, 16, 577, 1536]


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_dequantised_values_equal_gguf_bit_for_bit(qtype: Q, kernels: Libs) -> None:
    for cols in cols_for(qtype):
        w = weight(qtype, 7, cols, kernels[0], seed=cols)
        ours, ref = w.dequantize(), reference(w)
        assert torch.equal(ours.view(torch.int32), ref.view(torch.int32)), f"{qtype.name} K={cols}"
        ids = torch.tensor([[6, 0], [3, 3]])
        assert torch.equal(w.embedding(ids).view(torch.int32), ref[ids].view(torch.int32))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_product_is_the_skinny_kernels_on_the_dequantised_matrix(
    qtype: Q, kernels: Libs
) -> None:
    """Bit for bit (same lane-wise accumulation, same horizontal sums), and the float64
    product to fp32 rounding: ``|err| <= 1e-5 * sum_k |x_k w_k| + 1e-6``."""
    lib, sk = kernels
    g = torch.Generator().manual_seed(int(qtype))
    for cols in cols_for(qtype):
        for rows in (1, 3, 4, 13):
            w = weight(qtype, rows, cols, lib, seed=rows + cols)
            dense = reference(w)
            x, b = torch.randn(9, cols, generator=g), torch.randn(rows, generator=g)
            for bias in (None, b):
                got = w.linear(x, bias)
                assert torch.equal(got, skinny(sk, x, dense, bias)), f"{qtype.name} [{rows}, {cols}]"
                exact = F.linear(x.double(), dense.double(), None if bias is None else bias.double())
                bound = 1e-5 * (x.double().abs() @ dense.double().abs().T) + 1e-6
                assert bool(((got.double() - exact).abs() <= bound).all()), f"{qtype.name} [{rows}, {cols}]"


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_a_rows_result_does_not_depend_on_the_row_count(qtype: Q, kernels: Libs) -> None:
    """What keeps speculation exact against the same weights: every row count (1..64, across
    the in-register and tiled paths) gives each row the bits it gets alone."""
    cols = 512 if qtype in (Q.Q4_K, Q.Q6_K) else 576
    w = weight(qtype, 75, cols, kernels[0])  # 75 rows: blocks of 4 and 2, a tile of 64 and a partial one
    x = torch.randn(64, cols, generator=torch.Generator().manual_seed(1))
    alone = torch.cat([w.linear(x[i : i + 1]) for i in range(64)])
    for m in [*range(1, 33), 40, 64]:
        assert torch.equal(w.linear(x[:m]), alone[:m]), f"{qtype.name}: {m} rows"
    shuffled = torch.randperm(64, generator=torch.Generator().manual_seed(2))
    assert torch.equal(w.linear(x[shuffled]), alone[shuffled])


def test_threads_split_the_columns_without_changing_a_bit(kernels: Libs) -> None:
    """Many rows run over the torch thread count (columns split by tiles of 64): the same bits
    on 1, 2 or 3 threads, and the few-row paths stay on one."""
    w = weight(Q.Q4_1, 200, 576, kernels[0])
    x = torch.randn(24, 576, generator=torch.Generator().manual_seed(3))
    before = torch.get_num_threads()
    try:
        got = []
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            got.append(w.linear(x, torch.arange(200, dtype=torch.float32)))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(got[0], got[1]) and torch.equal(got[0], got[2])
    assert torch.equal(got[0][:1], w.linear(x[:1], torch.arange(200, dtype=torch.float32)))


def test_shapes_bias_and_inputs() -> None:
    w = weight(Q.Q4_1, 6, 64)
    assert w.linear(torch.empty(0, 64)).shape == (0, 6)
    x = torch.randn(5, 128)[:, ::2]  # not contiguous: taken as its values
    assert torch.equal(w.linear(x), w.linear(x.contiguous()))
    with pytest.raises(ValueError):
        w.linear(torch.randn(2, 63))
    with pytest.raises(ValueError):
        w.linear(torch.randn(2, 64, dtype=torch.float64))
    with pytest.raises(ValueError):
        w.linear(torch.randn(2, 64), torch.randn(5))
    with pytest.raises(IndexError):
        w.embedding(torch.tensor([6]))
    with pytest.raises(ValueError, match="whole blocks"):
        QuantWeight(int(Q.Q4_1), (2, 48), torch.zeros(2, 30, dtype=torch.uint8))
    with pytest.raises(ValueError, match="not read from blocks"):
        QuantWeight(int(Q.Q5_0), (2, 32), torch.zeros(2, 22, dtype=torch.uint8))
    assert w.nbytes == 6 * 2 * 20 and w.type_name == "Q4_1"


def test_rows_selected_and_stacked_stay_blocks_and_multiply_alike() -> None:
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(5))
    a, b, c = weight(Q.Q4_0, 8, 64, seed=1), weight(Q.Q4_0, 4, 64, seed=2), weight(Q.Q8_0, 4, 64, seed=3)
    same = stack([a, b])
    assert isinstance(same, QuantWeight) and same.shape == (12, 64)
    assert torch.equal(same.linear(x), torch.cat([a.linear(x), b.linear(x)], dim=1))
    mixed = stack([a, c])
    assert isinstance(mixed, StackedWeight) and mixed.shape == (12, 64)
    assert mixed.nbytes == a.nbytes + c.nbytes
    bias = torch.randn(12)
    parts = torch.cat([a.linear(x, bias[:8]), c.linear(x, bias[8:])], dim=1)
    assert torch.equal(mixed.linear(x, bias), parts)
    order = torch.tensor([3, 0, 7])
    assert torch.equal(a.select_rows(order).dequantize(), a.dequantize()[order])


def test_the_build_is_cached_by_source_flags_and_machine(tmp_path: Path) -> None:
    native = quant_linear.build()
    stamp = native.stat().st_mtime_ns
    assert quant_linear.build() == native and native.stat().st_mtime_ns == stamp  # not rebuilt
    avx2 = quant_linear.build(flags=AVX2)
    assert avx2 != native and quant_linear.bind(avx2).quant_vector_width() == 8
    source = tmp_path / "k.c"
    source.write_text("int k(void) { return 7; }\n")
    first = cbuild.compile_cached(source, ["-O2", "-shared", "-fPIC"], tmp_path / "out")
    assert ctypes.CDLL(str(first)).k() == 7
    source.write_text("int k(void) { return 8; }\n")
    second = cbuild.compile_cached(source, ["-O2", "-shared", "-fPIC"], tmp_path / "out")
    assert second != first and ctypes.CDLL(str(second)).k() == 8
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted([first.name, second.name])
