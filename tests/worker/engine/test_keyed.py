"""Keyed draws (worker/engine/keyed.py): the exponential race draws exactly p — head tokens,
the grouped tail and top-k zeros — with noise that depends on (seed, position, token) alone
(nj_kernels/philox.py; its known answers are in tests/nj_kernels/test_philox.py), and couples
two distributions as Gumbel-max does."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from scipy.stats import chisquare

from nj_kernels import philox
from worker.engine import keyed
from worker.engine.keyed import keyed_draw, keyed_draw_torch


def _chi2(draws: list[int], p: torch.Tensor) -> float:
    observed = torch.bincount(torch.tensor(draws), minlength=p.numel()).double()
    expected = p.double() * len(draws)
    assert float(observed[p == 0].sum()) == 0, "a token of probability 0 was drawn"
    small = (expected < 5) & (p > 0)  # pooled into one bin
    obs = torch.cat([observed[expected >= 5], observed[small].sum().view(1)])
    exp = torch.cat([expected[expected >= 5], expected[small].sum().view(1)])
    if float(exp[-1]) == 0:
        obs, exp = obs[:-1], exp[:-1]
    return float(chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item()).pvalue)


@pytest.fixture(params=["kernel", "torch"])
def path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each draw through the C kernel (where it builds) and through the torch reference."""
    if request.param == "kernel" and not philox.available():
        pytest.skip("needs a C compiler")
    philox.set_enabled(request.param == "kernel")
    yield request.param
    philox.set_enabled(True)


def test_the_race_draws_exactly_p_head_and_tail(monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    """A row with 20 % of its mass spread thinly below the floor (the grouped tail: raised to
    1e-3 here, so a small vocabulary has one), zeros (top-k) and head tokens: over 40,000
    positions every head token's frequency is p's and the tail's tokens share its 20 % by p."""
    monkeypatch.setattr(keyed, "HEAD_FLOOR", 1e-3)
    p = torch.zeros(512)
    p[:6] = torch.tensor([0.3, 0.2, 0.1, 0.1, 0.06, 0.04])
    p[100:500] = 0.2 / 400  # 5e-4 each: the tail
    p[300:400] *= 1.5
    p[400:500] *= 0.5
    n = 40_000
    draws = keyed_draw(p.unsqueeze(0).expand(n, -1), [11] * n, list(range(n)))
    assert 0.15 < sum(d >= 100 for d in draws) / n < 0.25  # the tail did win, now and then
    # Tail tokens in 4 bins of 100 ids: 0.05, 0.05, 0.075, 0.025 of the mass.
    binned = [d if d < 100 else 100 + (d - 100) // 100 for d in draws]
    q = torch.zeros(104)
    q[:6] = p[:6]
    q[100:] = torch.tensor([0.05, 0.05, 0.075, 0.025])
    assert _chi2(binned, q) > 1e-3


def test_draws_at_neighbouring_positions_are_independent() -> None:
    p = torch.tensor([0.4, 0.3, 0.2, 0.1])
    n = 20_000
    draws = keyed_draw(p.expand(2 * n, -1), [3] * 2 * n, list(range(2 * n)))
    pairs = [draws[2 * i] * 4 + draws[2 * i + 1] for i in range(n)]
    assert _chi2(pairs, (p.unsqueeze(1) * p.unsqueeze(0)).flatten()) > 1e-3


def test_a_draw_depends_on_its_row_seed_and_position_only() -> None:
    torch.manual_seed(0)
    probs = torch.softmax(torch.randn(6, 500) * 3, -1)
    seeds, positions = [1, 1, 2, 2, 3, 3], [0, 1, 0, 1, 0, 1]
    together = keyed_draw(probs, seeds, positions)
    alone = [
        keyed_draw(probs[i : i + 1], [s], [t])[0]
        for i, (s, t) in enumerate(zip(seeds, positions, strict=True))
    ]
    assert together == alone
    assert keyed_draw(probs.flip(0), seeds[::-1], positions[::-1]) == together[::-1]
    assert keyed_draw(torch.empty(0, 500), [], []) == []


def test_the_coupling_agrees_as_gumbels_does() -> None:
    """A drafter drawing with the target's noise proposes the target's token with probability
    between (1 − TV)/(1 + TV) (Gumbel-max coupling's floor) and 1 − TV (any coupling's ceiling);
    the same distribution, always."""
    torch.manual_seed(1)
    n = 6000
    p = torch.softmax(torch.randn(60) * 2, -1)
    q = torch.softmax(torch.log(p) + 0.7 * torch.randn(60), -1)
    tv = 0.5 * float((p - q).abs().sum())
    positions = list(range(n))
    target = keyed_draw(p.expand(n, -1), [9] * n, positions)
    assert keyed_draw(p.expand(n, -1), [9] * n, positions) == target
    agree = (
        sum(a == b for a, b in zip(target, keyed_draw(q.expand(n, -1), [9] * n, positions), strict=True)) / n
    )
    assert (1 - tv) / (1 + tv) - 0.03 < agree < 1 - tv + 0.03, (agree, tv)
    # Seeds are streams of their own: another seed's draws agree only by chance.
    other = keyed_draw(p.expand(n, -1), [10] * n, positions)
    chance = float((p * p).sum())
    assert abs(sum(a == b for a, b in zip(target, other, strict=True)) / n - chance) < 0.03


@pytest.mark.skipif(not philox.available(), reason="needs a C compiler")
def test_the_kernel_draws_what_the_torch_reference_draws(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows with a grouped tail that wins now and then (the floor raised to 2e-3), top-k zeros,
    peaked and flat rows, seeds and positions past 2³²: the same token from both paths."""
    monkeypatch.setattr(keyed, "HEAD_FLOOR", 2e-3)
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(3000, 700, generator=g) * torch.tensor([0.5, 2.0, 4.0]).repeat(1000).unsqueeze(1)
    logits[::5, 300:] = float("-inf")  # zeros, as top-k leaves them
    probs = torch.softmax(logits, -1)
    seeds = torch.randint(0, 2**62, (3000,), generator=g).tolist()
    positions = [i * 7919 + (2**33 if i % 7 == 0 else 0) for i in range(3000)]
    kernel = keyed_draw(probs, seeds, positions)
    assert kernel == keyed_draw_torch(probs, seeds, positions)
    tail = (probs < 2e-3) & (probs > 0)
    assert 0 < sum(bool(tail[i, t]) for i, t in enumerate(kernel)) < 3000  # the tail won sometimes
