"""The drafter pool: default drafter, catch-up only when a drafter resumes, scoring cadence,
and counterfactual acceptance for greedy, unseeded sampled and seeded (keyed) sequences."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from shared.schemas import SamplingParams
from tests.worker.engine.prompts import PROMPTS
from tests.worker.engine.spec.drafting import make_drafter, seq
from tests.worker.engine.tiny import hf_greedy, hf_model
from worker.engine.keyed import keyed_draw
from worker.engine.sampler import filtered_probs
from worker.engine.sequence import Sequence
from worker.engine.spec.ngram import NgramDrafter, ngram_predictions
from worker.engine.spec.pool import DrafterPool
from worker.engine.spec.verify import greedy_acceptance


@pytest.fixture
def pool(spec_models: dict[str, Path]) -> DrafterPool:
    return DrafterPool(
        [NgramDrafter(), make_drafter(spec_models["copy"]), make_drafter(spec_models["layer0"])]
    )


def test_default_and_unknown_names_resolve_to_the_first_model_drafter(pool: DrafterPool) -> None:
    assert pool.default == "copy"
    assert pool.resolve(None).name == pool.resolve("nope").name == "copy"
    assert pool.resolve("ngram").name == "ngram"
    assert DrafterPool([NgramDrafter()]).default == "ngram"
    with pytest.raises(ValueError, match="unique"):
        DrafterPool([NgramDrafter(), NgramDrafter()])


def test_catch_up_is_a_switching_cost_only_when_the_drafter_resumes(pool: DrafterPool) -> None:
    s = seq("a", PROMPTS[0])
    copy = pool.resolve("copy")
    event = pool.catch_up(copy, [s])
    assert event is not None and event.drafter == "copy" and event.batch_size == 1
    assert event.tokens == len(PROMPTS[0]) - 1 and event.input_len == len(PROMPTS[0]) and event.seconds > 0
    pool.last_active = "copy"
    s.token_ids.append(5)
    assert pool.catch_up(copy, [s]) is None  # it drafted last step: its catch-up is part of drafting
    pool.last_active = None
    assert pool.catch_up(copy, [s]) is not None


def test_scoring_cadence(spec_models: dict[str, Path]) -> None:
    every3 = DrafterPool([NgramDrafter()], every=3)
    assert [every3.due() for _ in range(7)] == [True, False, False, True, False, False, True]
    never = DrafterPool([NgramDrafter()], every=0)
    assert not any(never.due() for _ in range(5))


def test_greedy_counterfactual_is_argmax_agreement(pool: DrafterPool, spec_models: dict[str, Path]) -> None:
    target = hf_model(spec_models["target"])
    seqs, starts = [], []
    for i, p in enumerate(PROMPTS[:4]):
        s = seq(str(i), p + hf_greedy(target, p, 3, False))
        seqs.append(s)
        starts.append(len(p) + 1)  # the first generated token was verified at an earlier step
    rates = pool.counterfactual(pool.resolve("ngram"), seqs, starts, [None] * 4)
    assert set(rates) == {"copy", "layer0"}
    assert rates["copy"] == 1.0
    layer0 = hf_model(spec_models["layer0"])
    hits = 0.0
    for s, start in zip(seqs, starts, strict=True):
        with torch.inference_mode():
            pred = layer0(torch.tensor([s.token_ids])).logits[0, start - 1 : -1].argmax(-1).tolist()
        hits += greedy_acceptance(pred, s.token_ids[start:]) * (len(s.token_ids) - start)
    assert rates["layer0"] == pytest.approx(hits / 8)
    ngram = pool.counterfactual(pool.resolve("copy"), seqs, starts, [None] * 4)["ngram"]
    expected = sum(
        greedy_acceptance(ngram_predictions(s.token_ids, st), s.token_ids[st:]) * 2
        for s, st in zip(seqs, starts, strict=True)
    )
    assert ngram == pytest.approx(expected / 8)


def test_unseeded_sampled_counterfactual_is_one_minus_total_variation(
    pool: DrafterPool, spec_models: dict[str, Path]
) -> None:
    params = SamplingParams(temperature=0.7, top_p=0.9)
    s = seq("a", PROMPTS[5] + [11, 12, 13], params)
    start = len(PROMPTS[5])
    with torch.inference_mode():
        logits = hf_model(spec_models["target"])(torch.tensor([s.token_ids])).logits[0, start - 1 : -1]
    p = filtered_probs(logits, [params] * 3)
    rates = pool.counterfactual(pool.resolve("layer0"), [s], [start], [p])
    assert rates["copy"] == pytest.approx(1.0, abs=1e-4)  # q = p: 1 − TV = 1
    assert rates["ngram"] == pytest.approx(
        sum(float(p[j, x]) for j, x in enumerate(ngram_predictions(s.token_ids, start)) if x >= 0) / 3
    )


def test_seeded_counterfactual_is_the_coupled_draws_agreement(
    pool: DrafterPool, spec_models: dict[str, Path]
) -> None:
    """A seeded sequence's kept tokens are the target's keyed draws; a drafter is scored by
    whether its own keyed draw at each position (same noise) is that token: what keyed
    verification would have accepted there."""
    params = SamplingParams(temperature=1.0, seed=5)
    prompt, n = PROMPTS[5], 6
    target, layer0 = hf_model(spec_models["target"]), hf_model(spec_models["layer0"])
    tokens = list(prompt)
    for _ in range(n):  # the target alone, drawing keyed at output positions 0, 1, ...
        with torch.inference_mode():
            row = target(torch.tensor([tokens])).logits[0, -1:]
        tokens += keyed_draw(filtered_probs(row, [params]), [5], [len(tokens) - len(prompt)])
    s = Sequence("a", list(prompt), params, token_ids=tokens)
    start = len(prompt) + 1  # the first output token was verified at an earlier step
    with torch.inference_mode():
        rows = target(torch.tensor([tokens])).logits[0, start - 1 : -1]
        mine = layer0(torch.tensor([tokens])).logits[0, start - 1 : -1]
    p = filtered_probs(rows, [params] * (n - 1))
    rates = pool.counterfactual(pool.resolve("ngram"), [s], [start], [p])
    assert rates["copy"] == 1.0  # the target's own distribution: its coupled draw is the kept token
    drawn = keyed_draw(filtered_probs(mine, [params] * (n - 1)), [5] * (n - 1), list(range(1, n)))
    assert rates["layer0"] == pytest.approx(greedy_acceptance(drawn, tokens[start:]))
    preds = ngram_predictions(tokens, start)
    ngram = pool.counterfactual(pool.resolve("copy"), [s], [start], [p])["ngram"]
    assert ngram == pytest.approx(greedy_acceptance(preds, tokens[start:]))  # realised, not p(x)
