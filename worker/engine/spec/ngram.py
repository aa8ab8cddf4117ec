"""Prompt-lookup drafting: propose the tokens that followed the last earlier occurrence of
the sequence's final n-gram. Needs no weights and no KV cache."""

from __future__ import annotations

from worker.engine.sequence import Sequence
from worker.engine.spec.drafter import CatchUp, Drafter, Proposal, Scores


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


class NgramIndex:
    """``ngram_propose`` in O(max_n) per call: for every n-gram of one growing token list,
    the end of its most recent occurrence that has a following token.

    Tokens are only ever appended (``extend``); a shorter list means the caller rolled back
    something the index saw, and the index rebuilds.
    """

    def __init__(self, max_n: int = 4, min_n: int = 1) -> None:
        self.max_n, self.min_n = max_n, min_n
        self.tokens: list[int] = []
        self._end: dict[tuple[int, ...], int] = {}  # n-gram -> end (exclusive) of its last occurrence

    def extend(self, tokens: list[int], upto: int | None = None) -> None:
        """Make the index reflect ``tokens[:upto]`` (all of them by default)."""
        upto = len(tokens) if upto is None else upto
        if upto < len(self.tokens):
            self.tokens, self._end = [], {}
        own, end = self.tokens, self._end
        for m in range(len(own), upto):
            # Appending tokens[m] gives the n-grams ending at m a follower.
            for n in range(self.min_n, min(self.max_n, m) + 1):
                end[tuple(own[m - n : m])] = m
            own.append(tokens[m])

    def propose(self, k: int) -> list[int]:
        """Same answer as ``ngram_propose(self.tokens, k, max_n, min_n)``."""
        own = self.tokens
        length = len(own)
        if k <= 0:
            return []
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            e = self._end.get(tuple(own[length - n :]))
            if e is not None:
                return own[e : e + k]
        return []


class NgramDrafter(Drafter):
    """Prompt lookup as a drafter, named "ngram": no weights and no KV cache; its one piece
    of state per sequence is an ``NgramIndex`` of the verified tokens."""

    def __init__(self, max_n: int = 4, min_n: int = 1, name: str = "ngram") -> None:
        self.name, self.max_n, self.min_n = name, max_n, min_n
        self._index: dict[str, NgramIndex] = {}

    def _synced(self, seq: Sequence, upto: int) -> NgramIndex:
        index = self._index.get(seq.request_id)
        if index is None:
            index = self._index[seq.request_id] = NgramIndex(self.max_n, self.min_n)
        index.extend(seq.token_ids, upto)
        return index

    def catch_up(self, seqs: list[Sequence]) -> CatchUp:
        out = CatchUp()
        for seq in seqs:
            index = self._index.get(seq.request_id)
            missed = len(seq.token_ids) - 1 - (len(index.tokens) if index else 0)
            if missed > 0:
                self._synced(seq, len(seq.token_ids) - 1)
                out.batch_size += 1
                out.tokens = max(out.tokens, missed)
                out.input_len = max(out.input_len, len(seq.token_ids))
        return out

    def propose(self, seqs: list[Sequence], ks: list[int]) -> Proposal:
        tokens = [self._synced(seq, len(seq.token_ids)).propose(k) for seq, k in zip(seqs, ks, strict=True)]
        # No probabilities: a lookup proposes deterministically (q is a point mass).
        return Proposal(tokens, [None] * len(seqs))

    def proposal_length(self, seq: Sequence, k: int) -> int:
        """How many tokens ``propose`` would give ``seq`` now, at most ``k`` (a lookup)."""
        return len(self._synced(seq, len(seq.token_ids)).propose(k))

    def rollback(self, seq_id: str, num_tokens: int) -> None:
        index = self._index.get(seq_id)
        if index is not None and len(index.tokens) > num_tokens:
            index.extend(index.tokens, num_tokens)

    def score(self, seqs: list[Sequence], starts: list[int]) -> Scores:
        tokens = []
        for seq, start in zip(seqs, starts, strict=True):
            index, preds = self._synced(seq, start), []
            for j in range(start, len(seq.token_ids)):
                index.extend(seq.token_ids, j)
                prop = index.propose(1)
                preds.append(prop[0] if prop else -1)
            tokens.append(preds)
        return Scores(tokens, [None] * len(seqs))

    def free(self, seq_id: str) -> None:
        self._index.pop(seq_id, None)

    def reset(self) -> None:
        self._index.clear()
