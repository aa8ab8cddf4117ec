from worker.engine.spec.ngram import ngram_predictions, ngram_propose


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
