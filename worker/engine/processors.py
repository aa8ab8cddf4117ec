"""Logits processors on the target's rows, applied before verification.

A candidate's row i scores the position after the sequence's tokens plus its first i drafts,
so each row is processed with exactly that context (as if those drafts were accepted: the
rows after a rejection are discarded anyway). Greedy verification then compares the drafts
with the argmax of the processed rows and rejection sampling uses the processed target
distribution, so speculative output equals the target's own under the same processors,
token for token (greedy) or in distribution (sampled).

vLLM's semantics: ``repetition_penalty`` over prompt and output tokens (a positive logit is
divided by it, a negative one multiplied); ``presence_penalty`` / ``frequency_penalty``
subtract once per distinct output token / per occurrence; ``logit_bias`` is added;
before ``min_tokens`` outputs EOS and ``stop_token_ids`` are masked. After a failover resume
the engine's prompt ends with the output already sent (``Sequence.resumed`` tokens): those
count as output here, so a resumed request's rows are the ones its first attempt would have
had (and a seeded one goes on with the same tokens). A structured-output request's grammar
masks every row last (worker/engine/grammar.py).
"""

from __future__ import annotations

from collections import Counter

import torch

from shared.schemas import SamplingParams
from worker.engine.sequence import Sequence


def process_rows(logits: torch.Tensor, seq: Sequence, drafts: list[int], eos: frozenset[int]) -> torch.Tensor:
    """The candidate's rows ([k+1, V]; ``drafts`` are its k drafts, after the tokens ``seq``
    holds) with the sequence's processors applied (a new tensor; the input, which the logits
    cache may keep, is left as it is)."""
    p: SamplingParams = seq.params
    out = logits.float().clone()
    vocab = out.shape[-1]
    prompt = seq.prompt_token_ids
    output = seq.token_ids[len(prompt) - seq.resumed :]  # a resume's sent output included
    bias_ids = [t for t in p.logit_bias if t < vocab]
    bias = torch.tensor([p.logit_bias[t] for t in bias_ids], dtype=out.dtype)
    banned = sorted(t for t in eos | set(p.stop_token_ids) if t < vocab)
    for i in range(out.shape[0]):
        gen = output + drafts[:i]
        row = out[i]
        if p.repetition_penalty != 1.0:
            seen = torch.tensor(sorted({t for t in (*prompt, *gen) if t < vocab}), dtype=torch.long)
            if len(seen):
                vals = row[seen]
                row[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
        if (p.presence_penalty or p.frequency_penalty) and gen:
            counts = Counter(t for t in gen if t < vocab)
            ids = torch.tensor(list(counts), dtype=torch.long)
            n = torch.tensor(list(counts.values()), dtype=out.dtype)
            row[ids] -= p.frequency_penalty * n + p.presence_penalty
        if bias_ids:
            row[torch.tensor(bias_ids, dtype=torch.long)] += bias
        if len(gen) < p.min_tokens and banned:
            row[torch.tensor(banned, dtype=torch.long)] = float("-inf")
    if seq.grammar is not None:  # last: the grammar's mask along the drafted path (grammar.py)
        seq.grammar.mask_rows(out, drafts, logits)
    return out
