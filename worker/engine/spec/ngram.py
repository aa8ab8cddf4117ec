"""Prompt-lookup drafting: propose the tokens that followed the last earlier occurrence of
the sequence's final n-gram. Needs no weights and no KV cache."""

from __future__ import annotations


def ngram_propose(tokens: list[int], k: int, max_n: int = 4, min_n: int = 1) -> list[int]:
    """Up to k tokens continuing the longest suffix n-gram (n from max_n down to min_n) that
    occurred earlier in ``tokens``; the most recent occurrence wins. Empty if none."""
    length = len(tokens)
    if k <= 0 or length < min_n + 1:
        return []
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = tokens[length - n :]
        first = suffix[0]
        # Scan backwards so the most recent match (most relevant context) is used.
        for start in range(length - n - 1, -1, -1):
            if tokens[start] == first and tokens[start : start + n] == suffix:
                follow = tokens[start + n : start + n + k]
                if follow:
                    return follow
    return []


def ngram_predictions(tokens: list[int], start: int, max_n: int = 4, min_n: int = 1) -> list[int]:
    """For each position j ≥ start, the token the lookup would have proposed first from
    ``tokens[:j]`` (-1 when it had no match): the counterfactual for full-information feedback."""
    return [
        (prop[0] if (prop := ngram_propose(tokens[:j], 1, max_n, min_n)) else -1)
        for j in range(start, len(tokens))
    ]
