"""Philox-4x32-10 (nj_kernels/philox.py): Random123's known answers, and the C kernel computing
exactly the torch reference's uniforms, every bit, for any seed, position, token and stream."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from nj_kernels import philox
from nj_kernels.philox import MASK32, philox4x32, round_keys, uniforms, uniforms_torch

# Random123's kat_vectors for philox4x32_10: (counter, key) -> output.
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((MASK32,) * 4, (MASK32, MASK32), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


@pytest.fixture
def torch_only() -> Iterator[None]:
    philox.set_enabled(False)
    yield
    philox.set_enabled(True)


@pytest.mark.parametrize(("counter", "key", "expected"), KAT)
def test_philox_matches_random123(
    counter: tuple[int, int, int, int], key: tuple[int, int], expected: tuple[int, ...]
) -> None:
    keys = torch.tensor(round_keys(key[0] | key[1] << 32)).view(-1, 1)
    c0, c1, c2, c3 = (torch.tensor([c]) for c in counter)
    assert tuple(int(w) for w in philox4x32((c0, c1, c2, c3), keys)) == expected


def test_uniforms_are_words_of_the_counter_of_four_tokens() -> None:
    """Token v's uniform is word v % 4 of Philox at counter (v // 4, position, stream)."""
    seed, pos, stream = 0xA4093822 | 0x299F31D0 << 32, 0x85A308D3, 0x03707344
    ids = torch.tensor([0x243F6A88 * 4 + w for w in range(4)])
    u = uniforms_torch([seed], [pos], torch.zeros(4, dtype=torch.long), ids, stream)
    # Counter (0x243f6a88, 0x85a308d3, 0, 0x03707344): not a KAT counter, so compute it here.
    keys = torch.tensor(round_keys(seed)).view(-1, 1)
    c = (torch.tensor([0x243F6A88]), torch.tensor([pos]), torch.tensor([0]), torch.tensor([stream]))
    words = [int(w) for w in philox4x32(c, keys)]
    assert u.tolist() == [(w + 0.5) / 2**32 for w in words]


def test_uniforms_are_a_function_of_seed_position_token_and_stream(torch_only: None) -> None:
    ids = torch.arange(64)
    rows = torch.zeros(64, dtype=torch.long)
    u = uniforms([7], [3], rows, ids, 1)
    assert u.dtype == torch.float64 and bool(((u > 0) & (u < 1)).all())
    assert torch.equal(u, uniforms([7], [3], rows, ids, 1))
    # Element by element: the same token's uniform in any other company, in any order.
    picked = uniforms([5, 7], [0, 3], torch.ones(3, dtype=torch.long), ids[[40, 2, 9]], 1)
    assert torch.equal(picked, u[[40, 2, 9]])
    for other in ([8], [3], 1), ([7], [4], 1), ([7], [3], 2):
        assert not bool(torch.isclose(u, uniforms(other[0], other[1], rows, ids, other[2])).any())
    # Seeds and positions use all their bits (a seed past 2^32, a position past 2^32).
    big = uniforms([7 + 2**40, 7], [3, 3 + 2**33], torch.tensor([0, 1]), torch.tensor([0, 0]), 1)
    assert float(big[0]) != float(u[0]) and float(big[1]) != float(u[0])


@pytest.mark.skipif(not philox.available(), reason="needs a C compiler")
def test_the_kernel_computes_the_references_uniforms_bit_for_bit() -> None:
    g = torch.Generator().manual_seed(0)
    seeds = [0, 1, MASK32, 2**32, 2**63 - 1, *torch.randint(0, 2**62, (11,), generator=g).tolist()]
    positions = [0, 1, MASK32, 2**33 + 5, 2**63 - 1, *torch.randint(0, 2**40, (11,), generator=g).tolist()]
    rows = torch.randint(0, len(seeds), (5000,), generator=g)
    ids = torch.cat(
        [torch.tensor([0, 1, 2, 3, MASK32, 4 * MASK32 + 3]), torch.randint(0, 2**20, (4994,), generator=g)]
    )
    for stream in (0, 0x4E4A0001, MASK32):
        kernel = uniforms(seeds, positions, rows, ids, stream)
        assert torch.equal(kernel, uniforms_torch(seeds, positions, rows, ids, stream))
    assert uniforms(
        [1], [2], torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long), 3
    ).shape == (0,)
