import random

from shared.schemas import SamplingParams
from worker.engine.sequence import Sequence
from worker.engine.spec.ngram import NgramDrafter, NgramIndex, ngram_predictions, ngram_propose


def test_proposes_continuation_of_most_recent_match() -> None:
    toks = [1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3]
    assert ngram_propose(toks, 2) == [7, 8]


def test_prefers_longer_ngrams() -> None:
    toks = [5, 3, 4, 6, 3, 4, 2, 5, 3, 4]
    # suffix (5,3,4) occurred at the start, followed by 6; (3,4) alone last followed by 2.
    assert ngram_propose(toks, 1, max_n=3) == [6]
    assert ngram_propose(toks, 1, max_n=2) == [2]


def test_no_match_gives_nothing() -> None:
    assert ngram_propose([1, 2, 3, 4], 3) == []
    assert ngram_propose([1], 3) == []
    assert ngram_propose([1, 1], 0) == []


def test_counterfactual_predictions() -> None:
    toks = [1, 2, 1, 2, 1]
    # From [1,2,1] the lookup proposes 2; from [1,2,1,2] it proposes 1.
    assert ngram_predictions(toks, 3) == [2, 1]
    assert ngram_predictions([4, 5, 6], 1) == [-1, -1]


def test_index_answers_like_the_scan_on_every_prefix() -> None:
    rng = random.Random(3)
    for max_n in (1, 2, 4):
        tokens = [rng.randrange(6) for _ in range(300)]
        index = NgramIndex(max_n=max_n)
        for m in range(len(tokens) + 1):
            index.extend(tokens, m)
            for k in (1, 3):
                assert index.propose(k) == ngram_propose(tokens[:m], k, max_n=max_n)


def test_index_rebuilds_when_the_tokens_shrink() -> None:
    index = NgramIndex()
    index.extend([1, 2, 3, 1, 2, 9])
    index.extend([1, 2, 3, 1, 2], 4)
    assert index.tokens == [1, 2, 3, 1] and index.propose(2) == ngram_propose([1, 2, 3, 1], 2)


def _seq(tokens: list[int]) -> Sequence:
    return Sequence("s", tokens[:2], SamplingParams(), token_ids=list(tokens))


def test_drafter_proposes_scores_and_catches_up() -> None:
    d = NgramDrafter()
    seq = _seq([5, 1, 2, 3, 1, 2])
    done = d.catch_up([seq])
    assert (done.batch_size, done.tokens, done.input_len) == (1, 5, 6)
    assert d.catch_up([seq]).tokens == 0
    assert d.propose([seq], [3]).tokens == [[3, 1, 2]]
    seq.token_ids += [3, 7, 1]  # verified this step: positions 6, 7, 8
    scores = d.score([seq], [6])
    assert scores.tokens == [ngram_predictions(seq.token_ids, 6)] == [[3, 1, -1]]
    assert scores.logits == [None]
    d.free("s")
    assert d.propose([seq], [0]).tokens == [[]]
