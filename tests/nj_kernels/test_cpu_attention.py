"""The row-invariant CPU attention (nj_kernels/cpu_attention): torch's paged attention to
rounding, and each row's output the same bits however many rows, sequences and padded pages
share the call; on the build for this CPU and the AVX2 one."""

from __future__ import annotations

import ctypes
import platform

import pytest
import torch

from nj_kernels import cpu_attention
from nj_kernels.paged_attention import paged_attention_torch

pytestmark = pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64") or not cpu_attention.available(),
    reason="the attention kernel needs an x86-64 CPU with AVX2/FMA and a C compiler",
)
AVX2 = ["-O3", "-march=native", "-mno-avx512f", "-shared", "-fPIC"]
BS, NB = 4, 64


@pytest.fixture(scope="module", params=["native", "avx2"])
def lib(request: pytest.FixtureRequest) -> ctypes.CDLL:
    flags = None if request.param == "native" else AVX2
    return cpu_attention.bind(cpu_attention.build(flags=flags))


def cache(kvh: int, d: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(2, NB, BS, kvh, d, generator=torch.Generator().manual_seed(seed))


def tables(lengths: list[int]) -> torch.Tensor:
    """Disjoint, shuffled pages per sequence, padded with 0 to the longest."""
    perm = torch.randperm(NB - 1, generator=torch.Generator().manual_seed(9)) + 1
    pages = [-(-n // BS) for n in lengths]
    rows, at = [], 0
    for p in pages:
        rows.append(perm[at : at + p].tolist() + [0] * (max(pages) - p))
        at += p
    return torch.tensor(rows, dtype=torch.int32)


@pytest.mark.parametrize(("h", "kvh", "d"), [(4, 2, 64), (9, 3, 64), (4, 4, 16), (8, 2, 40), (6, 1, 128)])
def test_it_is_torchs_attention_to_rounding(lib: ctypes.CDLL, h: int, kvh: int, d: int) -> None:
    kv = cache(kvh, d, seed=h)
    lengths, nq = [7, 30, 19], 3
    q = torch.randn(len(lengths) * nq, h, d, generator=torch.Generator().manual_seed(1))
    bt, ctx = tables(lengths), torch.tensor(lengths, dtype=torch.int32)
    ours = cpu_attention.paged_attention_rows(q, kv, bt, ctx, nq, d**-0.5, lib)
    ref = paged_attention_torch(
        q.view(len(lengths), nq, h, d), kv[0], kv[1], bt, ctx, torch.full_like(ctx, nq), d**-0.5
    ).reshape(-1, h, d)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("h", "kvh", "d"), [(4, 2, 64), (9, 3, 64), (8, 2, 40)])
def test_a_rows_output_does_not_depend_on_the_rows_around_it(
    lib: ctypes.CDLL, h: int, kvh: int, d: int
) -> None:
    """One query row, attended alone, among the γ+1 rows of its sequence, and beside other
    sequences that pad the block tables further: the same bits (torch's SDPA differs here)."""
    kv = cache(kvh, d)
    lengths, nq = [13, 41, 6, 28], 5
    q = torch.randn(len(lengths) * nq, h, d, generator=torch.Generator().manual_seed(2))
    bt, ctx = tables(lengths), torch.tensor(lengths, dtype=torch.int32)
    together = cpu_attention.paged_attention_rows(q, kv, bt, ctx, nq, 0.125, lib)
    for s, n in enumerate(lengths):
        own = bt[s : s + 1, : -(-n // BS)]
        rows = q[s * nq : (s + 1) * nq]
        mine = cpu_attention.paged_attention_rows(rows, kv, own, ctx[s : s + 1], nq, 0.125, lib)
        assert torch.equal(mine, together[s * nq : (s + 1) * nq])
        for j in range(nq):  # each row as a one-row decode step at its position
            row = q[s * nq + j : s * nq + j + 1]
            at = torch.tensor([n - nq + j + 1])
            alone = cpu_attention.paged_attention_rows(row, kv, own, at, 1, 0.125, lib)
            assert torch.equal(alone[0], together[s * nq + j]), f"sequence {s}, row {j}"


def test_strided_rows_and_refusals() -> None:
    kv = cache(2, 16)
    qk = torch.randn(3, 6, 16)  # q heads then k heads, as the model's fused q/k rows are laid out
    q = qk[:, :4]
    bt, ctx = tables([9]), torch.tensor([9], dtype=torch.int32)
    assert torch.equal(
        cpu_attention.paged_attention_rows(q, kv, bt, ctx, 3, 0.25),
        cpu_attention.paged_attention_rows(q.contiguous(), kv, bt, ctx, 3, 0.25),
    )
    with pytest.raises(ValueError, match="not 1 sequences"):
        cpu_attention.paged_attention_rows(q, kv, bt, ctx, 2, 0.25)
    with pytest.raises(ValueError, match="fp32"):
        cpu_attention.paged_attention_rows(q.double(), kv.double(), bt, ctx, 3, 0.25)
    assert not cpu_attention.supports(64, 2, 64) and not cpu_attention.supports(8, 2, 512)
    assert cpu_attention.supports(9, 3, 64)
