"""Model-free drafters judged on the text already verified, at every step (γ = 0 included).

The n-gram drafter costs a dictionary lookup, so what it would have done is cheap to know
exactly, whatever ran: at a position j of a sequence's output whose next ``depth`` tokens are
verified, propose ``depth`` tokens from ``tokens[:j]`` and count how many of them lead the
verified ones. Over positions, a histogram of those accepted lengths (0..depth) and one of the
proposals' lengths give, for every γ ≤ depth at once, the tokens a verification would emit,
E_γ = 1 + mean(min(a, γ)), and the draft rows it would verify, mean(min(l, γ)). Both matter:
n-gram proposals are often short or empty, and its hits come in runs, so E(α, γ) from one
per-token α misjudges it (on SmolLM2's own chat continuations: α 0.31 at γ = 1, yet E at γ = 4
is 1.90, not E(0.31, 4) = 1.45; no proposal at 40 % of positions). The planner's prior
(planner/policies/prior.py) reads the histograms from telemetry (``StepStats.lookahead``), so
speculation with n-gram is judged without running it: the prior, not users' latency, pays
for learning it.

The judge follows at most ``max_sequences`` sequences at a time (a lagging ``NgramIndex``
each, kept in step with its verified tokens: the cost is per token of the followed sequences,
so it stays small at any batch size); a sequence beyond that is not followed until a followed
one is freed. Each followed sequence gives its newest ready position per step (one a step at
γ = 0; a speculative step that verified several tokens skips the older ones).
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.control import Lookahead
from worker.engine.sequence import Sequence
from worker.engine.spec.ngram import NgramDrafter, NgramIndex

DEPTH = 4  # tokens judged after each position (the planner's γ range by default)
MAX_SEQUENCES = 4  # sequences followed at a time


@dataclass(frozen=True)
class Judged:
    """One model-free drafter at one position: how many of its proposed tokens led the
    verified ones (``hit``), of how many it proposed."""

    hit: int
    proposed: int


class LookaheadJudge:
    """Histograms of what each model-free drafter would have accepted, step by step."""

    def __init__(
        self, drafters: list[NgramDrafter], depth: int = DEPTH, max_sequences: int = MAX_SEQUENCES
    ) -> None:
        if depth < 1 or max_sequences < 1:
            raise ValueError("the lookahead needs depth ≥ 1 and max_sequences ≥ 1")
        self.drafters, self.depth, self.max_sequences = drafters, depth, max_sequences
        self._index: dict[tuple[str, str], NgramIndex] = {}  # (drafter, sequence) -> lagging index
        self._next: dict[str, int] = {}  # followed sequence -> first position not judged yet

    def judge(self, seqs: list[Sequence]) -> dict[str, Lookahead]:
        """Each drafter's histograms over this step's newly ready positions (empty: none)."""
        return self.histograms(self.judge_each(seqs))

    def judge_each(self, seqs: list[Sequence]) -> dict[str, dict[str, Judged]]:
        """Per followed sequence with a newly ready position (by request id), each drafter's
        judgement there."""
        for seq in seqs:
            if len(self._next) >= self.max_sequences:
                break
            self._next.setdefault(seq.request_id, seq.num_prompt + 1)
        out: dict[str, dict[str, Judged]] = {}
        for seq in seqs:
            j = self._ready(seq)
            if j is None:
                continue
            tokens, verified = seq.token_ids, seq.token_ids[j : j + self.depth]
            mine = out[seq.request_id] = {}
            for d in self.drafters:
                index = self._index.get((d.name, seq.request_id))
                if index is None:
                    index = self._index[(d.name, seq.request_id)] = NgramIndex(d.max_n, d.min_n)
                index.extend(tokens, j)
                proposal = index.propose(self.depth)
                hit = 0
                while hit < len(proposal) and proposal[hit] == verified[hit]:
                    hit += 1
                mine[d.name] = Judged(hit, len(proposal))
            self._next[seq.request_id] = j + 1
        return out

    def histograms(self, judged: dict[str, dict[str, Judged]]) -> dict[str, Lookahead]:
        """Each drafter's histograms of accepted and proposed lengths over ``judged``."""
        if not judged:
            return {}
        out = {d.name: Lookahead(accepted=[0] * (self.depth + 1), proposed=[0] * (self.depth + 1))
               for d in self.drafters}  # fmt: skip
        for mine in judged.values():
            for name, x in mine.items():
                out[name].accepted[x.hit] += 1
                out[name].proposed[x.proposed] += 1
        return out

    def _ready(self, seq: Sequence) -> int | None:
        """The newest position of a followed ``seq`` with ``depth`` verified tokens after it,
        if not judged yet (a sequence's first draft comes after its first output token)."""
        first = self._next.get(seq.request_id)
        j = len(seq.token_ids) - self.depth
        return j if first is not None and j >= first else None

    def free(self, seq_id: str) -> None:
        self._next.pop(seq_id, None)
        for d in self.drafters:
            self._index.pop((d.name, seq_id), None)

    def reset(self) -> None:
        self._index.clear()
        self._next.clear()
