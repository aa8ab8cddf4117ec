"""The engine's processors and sampler at the extremes the request schema allows: every
probability stays finite (a request's numbers can never make the engine fail), and the
values just past the bounds are refused by the schema (a 400 at the gateway)."""

from __future__ import annotations

import itertools

import pytest
import torch
from pydantic import ValidationError

from shared.schemas import INT32_MAX, MAX_REPETITION_PENALTY, MIN_REPETITION_PENALTY, SamplingParams
from worker.engine.processors import process_rows
from worker.engine.sampler import filtered_probs
from worker.engine.sequence import Sequence

V = 64
PROMPT = list(range(0, 40))
OUTPUT = [1, 2, 2, 3, 3, 3] * 50  # repeated tokens: frequency penalties scale with the count

EXTREMES: dict[str, list[object]] = {
    "temperature": [0.0, 1e-300, 5e-324, 1e-4, 10.0],
    "top_p": [5e-324, 1e-300, 0.5, 1.0],
    "top_k": [0, 1, V, INT32_MAX],
    "repetition_penalty": [MIN_REPETITION_PENALTY, 1.0, MAX_REPETITION_PENALTY],
    "presence_penalty": [-2.0, 2.0],
    "frequency_penalty": [-2.0, 2.0],
    "logit_bias": [{}, {1: 100.0, 2: -100.0, 5: 100.0}],
}


def _rows(scale: float) -> torch.Tensor:
    """Logits as large as a model in float16/bfloat16 can give (and a row of equal ones)."""
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(3, V, generator=g) * scale
    rows[2] = scale
    return rows


@pytest.mark.parametrize("scale", [1.0, 100.0, 65504.0])
def test_allowed_extremes_keep_probabilities_finite(scale: float) -> None:
    names = list(EXTREMES)
    combos = 0
    for values in itertools.product(*(EXTREMES[n] for n in names)):
        params = SamplingParams(**dict(zip(names, values, strict=True)))  # type: ignore[arg-type]
        seq = Sequence("r", list(PROMPT), params)
        seq.token_ids = PROMPT + OUTPUT
        processed = process_rows(_rows(scale), seq, [], frozenset({0}))
        assert not torch.isnan(processed).any(), params
        if params.greedy:
            continue
        probs = filtered_probs(processed, [params] * processed.shape[0])  # raises on non-finite
        assert torch.isfinite(probs).all()
        assert torch.allclose(probs.sum(dim=1), torch.ones(processed.shape[0]), atol=1e-4), params
        combos += 1
    assert combos > 500


@pytest.mark.parametrize(
    "field, value",
    [
        ("repetition_penalty", 1e-300),
        ("repetition_penalty", 0.0),
        ("repetition_penalty", -1.0),
        ("repetition_penalty", float("nan")),
        ("repetition_penalty", float("inf")),
        ("repetition_penalty", 1e300),
        ("temperature", float("nan")),
        ("temperature", float("inf")),
        ("temperature", 1e300),
        ("top_p", 0.0),
        ("top_p", float("nan")),
        ("presence_penalty", float("inf")),
        ("frequency_penalty", float("nan")),
        ("logit_bias", {1: float("inf")}),
        ("logit_bias", {1: 1e300}),
    ],
)
def test_values_past_the_bounds_are_refused(field: str, value: object) -> None:
    with pytest.raises(ValidationError):
        SamplingParams(**{field: value})  # type: ignore[arg-type]
