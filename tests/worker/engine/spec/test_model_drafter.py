"""A model drafter drafts its own greedy continuation, rolls back, catches up and scores
exactly as the model alone would, through its own paged KV."""

from __future__ import annotations

from pathlib import Path

import torch

from shared.schemas import SamplingParams
from tests.worker.engine.prompts import PROMPTS
from tests.worker.engine.spec.drafting import make_drafter, seq
from tests.worker.engine.tiny import hf_greedy, hf_model
from worker.engine.keyed import keyed_draw
from worker.engine.sampler import filtered_probs
from worker.engine.spec.model_drafter import PROMPT_CONTEXT


def test_greedy_drafts_are_the_models_own_continuation(spec_models: dict[str, Path]) -> None:
    path = spec_models["rand-b"]
    hf = hf_model(path)
    drafter = make_drafter(path, max_tokens=7)  # prompts span several chunked forwards
    seqs = [seq("a", PROMPTS[0]), seq("b", PROMPTS[1]), seq("c", PROMPTS[3])]
    out = drafter.propose(seqs, [3, 0, 5])
    assert out.tokens == [hf_greedy(hf, PROMPTS[0], 3, False), [], hf_greedy(hf, PROMPTS[3], 5, False)]
    assert out.probs == [None, None, None]
    # The last draft is never fed: the cache holds the sequence and all drafts but it.
    assert drafter.computed == {"a": len(PROMPTS[0]) + 2, "c": len(PROMPTS[3]) + 4}


def test_rollback_then_drafting_continues_from_the_verified_tokens(spec_models: dict[str, Path]) -> None:
    path = spec_models["layer0"]
    hf = hf_model(path)
    drafter = make_drafter(path)
    s = seq("a", PROMPTS[2])
    first = drafter.propose([s], [4]).tokens[0]
    # The target kept two drafts and chose its own third token.
    s.token_ids += [*first[:2], (first[2] + 1) % 96]
    drafter.rollback("a", len(PROMPTS[2]) + 2)
    assert drafter.computed["a"] == len(PROMPTS[2]) + 2
    assert drafter.propose([s], [3]).tokens[0] == hf_greedy(hf, s.token_ids, 3, False)


def test_catch_up_then_score_predicts_the_models_argmax(spec_models: dict[str, Path]) -> None:
    path = spec_models["rand-a"]
    drafter = make_drafter(path, max_tokens=5)
    s = seq("a", PROMPTS[0])
    assert drafter.lag(s) == len(PROMPTS[0]) - 1  # what a switch into it would catch up on
    done = drafter.catch_up([s])
    assert drafter.lag(s) == 0
    assert (done.batch_size, done.tokens, done.input_len) == (1, len(PROMPTS[0]) - 1, len(PROMPTS[0]))
    assert drafter.catch_up([s]).tokens == 0
    start = len(s.token_ids)
    s.token_ids += [7, 8, 9]  # three verified tokens
    scores = drafter.score([s], [start])
    with torch.inference_mode():
        logits = hf_model(path)(torch.tensor([s.token_ids])).logits[0]
    assert scores.tokens == [logits[start - 1 : -1].argmax(-1).tolist()]
    logits_row = scores.logits[0]
    assert logits_row is not None and torch.allclose(logits_row, logits[start - 1 : -1], atol=1e-4)
    assert drafter.computed["a"] == len(s.token_ids) - 1


def test_a_full_pool_drops_only_the_sequence_that_does_not_fit(spec_models: dict[str, Path]) -> None:
    drafter = make_drafter(spec_models["rand-a"], num_blocks=4)  # 16 positions
    short, long = seq("short", [5, 6, 7]), seq("long", list(range(3, 30)))
    out = drafter.propose([short, long], [2, 2])
    assert len(out.tokens[0]) == 2 and out.tokens[1] == []
    assert "long" not in drafter.computed and drafter.blocks.table("long") == []
    drafter.free("short")
    assert drafter.blocks.num_free_blocks == 4


def test_sampled_drafts_come_with_their_distribution(spec_models: dict[str, Path]) -> None:
    """Unseeded: drawn with the request's generator, q for rejection sampling. Seeded: the
    keyed draw from q at each draft's output position (the target's noise there)."""
    drafter = make_drafter(spec_models["rand-a"])
    params = SamplingParams(temperature=0.8, top_k=5)
    s = seq("x", PROMPTS[4], params)
    out = drafter.propose([s], [4])
    q = out.probs[0]
    assert q is not None and q.shape == (4, 96)
    assert torch.allclose(q.sum(-1), torch.ones(4)) and ((q > 0).sum(-1) <= 5).all()
    assert all(q[i, t] > 0 for i, t in enumerate(out.tokens[0]))
    seeded = params.model_copy(update={"seed": 3})
    runs = []
    for name in ("y", "z"):
        keyed = drafter.propose([seq(name, PROMPTS[4], seeded)], [4])
        kq = keyed.probs[0]
        assert kq is not None and kq.shape == (4, 96)
        assert keyed.tokens[0] == keyed_draw(kq, [3] * 4, [0, 1, 2, 3])
        runs.append(keyed.tokens[0])
    assert runs[0] == runs[1]
    # Each is the drafter's own keyed draw at output positions 0, 1, ... after its drafts.
    hf = hf_model(spec_models["rand-a"])
    tokens = list(PROMPTS[4])
    for pos in range(4):
        with torch.inference_mode():
            row = hf(torch.tensor([tokens])).logits[0, -1:]
        tokens += keyed_draw(filtered_probs(row, [seeded]), [3], [pos])
    assert runs[0] == tokens[len(PROMPTS[4]) :]


def test_the_prompt_prior_reads_a_window_of_a_long_prompt_and_keeps_nothing(
    spec_models: dict[str, Path],
) -> None:
    """A long prompt is scored from the ``PROMPT_CONTEXT`` tokens before its scored positions,
    the model's own argmax on that window alone, in a scratch entry dropped after: the drafter
    stays as far behind as before (a switch into it pays the catch-up). A short one is scored
    in place, exactly as ``score``, and kept."""
    path = spec_models["rand-a"]
    drafter = make_drafter(path, max_tokens=16)
    tokens = [(7 * i + 3) % 90 + 2 for i in range(PROMPT_CONTEXT + 40)]
    long, short = seq("long", tokens), seq("short", tokens[:20])
    start = len(tokens) - 8
    scores = drafter.score_prompt([long, short], [start, 12])
    window = tokens[start - 1 - PROMPT_CONTEXT : -1]
    with torch.inference_mode():
        alone = hf_model(path)(torch.tensor([window])).logits[0, -8:]
        whole = hf_model(path)(torch.tensor([tokens[:20]])).logits[0, 11:-1]
    assert scores.tokens == [alone.argmax(-1).tolist(), whole.argmax(-1).tolist()]
    assert drafter.lag(long) == len(tokens) - 1 and drafter.lag(short) == 0
    assert set(drafter.computed) == {"short"} and set(drafter.blocks.tables) == {"short"}
    drafter.free("short")
    assert drafter.blocks.num_free_blocks == drafter.num_blocks
