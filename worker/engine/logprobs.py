"""Log-probabilities for the sequences that ask for them (``SamplingParams.logprobs`` /
``prompt_logprobs``): vLLM's default "raw" logprobs, the log-softmax of the target's own
logits before any processor, temperature or top-k / top-p.

Output tokens: a candidate's logits row i scores the position of its emitted token i, so a
token accepted under speculation gets its logprobs from the verification row at its
position, and a plain decode from its one row: the same target logits either way.

Prompt tokens: while a sequence that asks for them prefills for the first time, every row of
each prompt chunk is computed (not just the last), row p scoring prompt token p + 1; such a
sequence does not reuse cached prefix blocks (a cached prompt has no logits: see
``Sequence.wants_prompt_logprobs``) until its prompt's logprobs are complete.

Everything is kept by position, so a step that is undone (failure isolation, preemption)
and recomputed overwrites what it wrote instead of adding to it. Only ids and values are
filled here; the worker renders the tokens' text (``Logprobs.tokens``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from shared.schemas import Logprobs

FLOOR = -9999.0  # what -inf (and NaN) is reported as: vLLM's value for -inf


# One position: (token id, its logprob, the top ids, their logprobs).
Scored = tuple[int, float | None, list[int], list[float]]


@dataclass
class LogprobState:
    """One sequence's logprobs so far: of its output tokens (by output position) and, once
    complete, of its prompt."""

    k: int | None  # top-k of output positions; None: no output logprobs
    prompt_k: int | None  # top-k of prompt positions; None: no prompt logprobs
    output: list[Scored] = field(default_factory=list)  # one per output token
    prompt: list[Scored] = field(default_factory=list)  # prompt tokens 1.. scored so far
    prompt_reported: bool = False
    # This step's output rows (output position, rows, tokens), for score_pending.
    pending: list[tuple[int, torch.Tensor, list[int]]] = field(default_factory=list)

    def prompt_pending(self, num_prompt: int) -> bool:
        """Prompt logprobs are asked for and not complete yet."""
        return self.prompt_k is not None and len(self.prompt) < num_prompt - 1


def score(rows: torch.Tensor, tokens: list[int], k: int) -> list[Scored]:
    """One entry per row of ``rows [n, V]`` (raw logits): the log-softmax of ``tokens[i]``
    at row i and the top ``k`` of that row."""
    if not tokens:
        return []
    # Never NaN or -inf on the wire (JSON has neither): both are reported as FLOOR.
    lp = torch.log_softmax(rows[: len(tokens)].float(), dim=-1).nan_to_num(nan=FLOOR, neginf=FLOOR)
    ids = torch.tensor(tokens, dtype=torch.long, device=lp.device).unsqueeze(1)
    chosen = lp.gather(1, ids).squeeze(1).tolist()
    if k > 0:
        top = lp.topk(min(k, lp.shape[1]), dim=-1)
        top_ids, top_lps = top.indices.tolist(), top.values.tolist()
    else:
        top_ids = top_lps = [[] for _ in tokens]
    return list(zip(tokens, chosen, top_ids, top_lps, strict=True))


def columns(entries: list[Scored]) -> Logprobs:
    """The entries as one Logprobs (ids and values; built unvalidated: they are ours)."""
    return Logprobs.model_construct(
        token_ids=[e[0] for e in entries],
        tokens=[],
        logprobs=[e[1] for e in entries],
        top_ids=[e[2] for e in entries],
        top_tokens=[],
        top_logprobs=[e[3] for e in entries],
    )


def record_prompt(state: LogprobState, prompt: list[int], start: int, rows: torch.Tensor) -> None:
    """Rows of positions ``start ..`` of a prefill chunk: each scores the next prompt token."""
    assert state.prompt_k is not None
    end = min(start + rows.shape[0], len(prompt) - 1)
    del state.prompt[start:]
    if len(state.prompt) == start and end > start:
        state.prompt += score(rows, prompt[start + 1 : end + 1], state.prompt_k)


def record_output(state: LogprobState | None, position: int, rows: torch.Tensor, tokens: list[int]) -> None:
    """The output tokens ``tokens``, the first at output ``position``, scored on the rows of
    their positions (nothing unless output logprobs are asked for)."""
    if state is None or state.k is None:
        return
    del state.output[position:]
    state.pending = [p for p in state.pending if p[0] < position]
    state.pending.append((position, rows[: len(tokens)], tokens))


def score_pending(states: list[LogprobState]) -> None:
    """Score the output rows every sequence recorded this step in one log-softmax and one
    top-k over all of them (the step's rows: one device, one dtype)."""
    unique = {id(s): s for s in states}.values()  # a sequence may be listed twice
    work = [(s, pos, rows, tokens) for s in unique for pos, rows, tokens in s.pending]
    if not work:
        return
    k = max(s.k or 0 for s, *_ in work)
    scored = score(torch.cat([w[2] for w in work]), [t for w in work for t in w[3]], k)
    at = 0
    for s, pos, _, tokens in work:
        got, at = scored[at : at + len(tokens)], at + len(tokens)
        mine = s.k or 0
        del s.output[pos:]
        s.output += got if mine == k else [(t, v, ids[:mine], lps[:mine]) for t, v, ids, lps in got]
        s.pending.clear()


def take(
    state: LogprobState | None, reported: int, upto: int, prompt: list[int]
) -> tuple[Logprobs | None, Logprobs | None]:
    """What to report now: the logprobs of output tokens ``reported .. upto``, and the
    prompt's the first time there is any output (None, None: none asked for)."""
    if state is None:
        return None, None
    out = columns(state.output[reported:upto]) if state.k is not None else None
    prompt_lp = None
    if state.prompt_k is not None and not state.prompt_reported and upto > 0:
        state.prompt_reported = True
        prompt_lp = columns([(prompt[0], None, [], []), *state.prompt])
    return out, prompt_lp
