"""Sampler: greedy, temperature, top-k and top-p filtering, seeded (keyed) and unseeded draws."""

from __future__ import annotations

import math

import pytest
import torch

from shared.schemas import SamplingParams
from worker.engine.sampler import filtered_probs, new_generator, sample

LOGITS = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))


def kept(probs: torch.Tensor) -> list[int]:
    return torch.nonzero(probs[0]).flatten().tolist()


def test_greedy_is_argmax_per_row() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0], [5.0, 1.0, 4.9]])
    assert sample(logits, [SamplingParams(), SamplingParams()], [None, None], [0, 0]) == [1, 0]


def test_temperature_scales_logits() -> None:
    logits = torch.tensor([[1.0, 2.0, 4.0]])
    probs = filtered_probs(logits, [SamplingParams(temperature=0.5)])
    assert torch.allclose(probs, torch.softmax(logits / 0.5, dim=1))


def test_top_k_keeps_the_k_largest_and_ties() -> None:
    assert kept(filtered_probs(LOGITS, [SamplingParams(temperature=1.0, top_k=2)])) == [0, 1]
    tied = torch.tensor([[3.0, 1.0, 3.0, 2.0, 2.0]])
    assert kept(filtered_probs(tied, [SamplingParams(temperature=1.0, top_k=3)])) == [0, 2, 3, 4]
    probs = filtered_probs(LOGITS, [SamplingParams(temperature=1.0, top_k=2)])
    assert torch.allclose(probs[0, :2], torch.tensor([0.5, 0.3]) / 0.8)


def test_top_p_keeps_the_smallest_head_reaching_p() -> None:
    def head(p: float) -> list[int]:
        return kept(filtered_probs(LOGITS, [SamplingParams(temperature=1.0, top_p=p)]))

    assert head(0.5) == [0]
    assert head(0.51) == [0, 1]
    assert head(0.8) == [0, 1]
    assert head(0.81) == [0, 1, 2]
    assert head(1.0) == [0, 1, 2, 3]
    assert head(1e-6) == [0]  # never empty
    probs = filtered_probs(LOGITS, [SamplingParams(temperature=1.0, top_p=0.81)])
    assert math.isclose(float(probs.sum()), 1.0, rel_tol=1e-6)


def test_rows_are_filtered_independently() -> None:
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    params = [
        SamplingParams(temperature=0.7, top_k=5),
        SamplingParams(temperature=1.3, top_p=0.6),
        SamplingParams(temperature=1.0, top_k=10, top_p=0.9),
    ]
    together = filtered_probs(logits, params)
    for i, p in enumerate(params):
        assert torch.allclose(together[i], filtered_probs(logits[i : i + 1], [p])[0])


def test_seeded_draws_are_keyed_on_the_position_and_follow_the_distribution() -> None:
    params = SamplingParams(temperature=1.0, top_k=3, seed=42)
    logits = LOGITS.expand(4000, -1)
    positions = list(range(4000))
    a = sample(logits, [params] * 4000, [None] * 4000, positions)
    # Keyed on (seed, position): the same whatever the batch around them or its order.
    assert a == sample(logits, [params] * 4000, [None] * 4000, positions)
    assert a[1234] == sample(logits[:1], [params], [None], [1234])[0]
    assert a[::-1] == sample(logits, [params] * 4000, [None] * 4000, positions[::-1])
    other = sample(logits, [params.model_copy(update={"seed": 43})] * 4000, [None] * 4000, positions)
    assert other != a
    expected = torch.tensor([0.5, 0.3, 0.15, 0.0]) / 0.95
    for draws in (a, other):
        freq = torch.bincount(torch.tensor(draws), minlength=4).float() / 4000
        assert freq[3] == 0  # filtered out by top-k
        assert torch.allclose(freq, expected, atol=0.03)


def test_unseeded_draws_use_their_generator() -> None:
    params = SamplingParams(temperature=1.0, top_k=3)
    logits = LOGITS.expand(4000, -1)
    gen = torch.Generator().manual_seed(7)
    a = sample(logits, [params] * 4000, [gen] * 4000, [0] * 4000)
    gen.manual_seed(7)
    assert a == sample(logits, [params] * 4000, [gen] * 4000, [0] * 4000)
    freq = torch.bincount(torch.tensor(a), minlength=4).float() / 4000
    assert torch.allclose(freq, torch.tensor([0.5, 0.3, 0.15, 0.0]) / 0.95, atol=0.03)


def test_greedy_and_sampled_rows_mix() -> None:
    logits = torch.tensor([[0.0, 9.0], [9.0, 0.0]])
    params = [SamplingParams(temperature=1.0, top_k=1, seed=1), SamplingParams()]
    assert sample(logits, params, [new_generator(params[0]), None], [0, 0]) == [1, 0]


def test_a_vanishing_temperature_is_floored_and_bad_logits_raise() -> None:
    logits = torch.tensor([[0.0, 1.0, 0.5]])
    tiny = SamplingParams.model_construct(temperature=1e-300)  # past any validator: float32 makes it 0
    probs = filtered_probs(logits, [tiny])
    assert torch.isfinite(probs).all() and int(probs.argmax()) == 1
    with pytest.raises(ValueError, match="not finite"):
        filtered_probs(torch.tensor([[float("nan"), 1.0, 0.0]]), [SamplingParams(temperature=1.0)])
