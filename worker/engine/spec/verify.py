"""The verification step of speculative decoding.

The target scored γ draft tokens plus one more position in a single forward. Greedy keeps
the longest prefix of drafts that equal the target's argmax, then the target's own token.
Sampling is standard speculative rejection sampling (Leviathan et al. 2023; Chen et al.
2023): accept draft x with probability min(1, p(x)/q(x)); on the first rejection draw from
normalise(max(0, p − q)) and stop; if all pass, draw a bonus token from the last p. The
emitted tokens are then distributed exactly as sampling from the target alone.
"""

from __future__ import annotations

import torch

from worker.engine.processors import process_rows
from worker.engine.records import Candidate, Verified
from worker.engine.sampler import filtered_probs


def verify_greedy(target: torch.Tensor, draft: torch.Tensor, num_draft: torch.Tensor) -> list[list[int]]:
    """Batched greedy verification.

    target: [B, K+1] the target's argmax at the K draft positions and the one after.
    draft: [B, K] proposed tokens (rows may be shorter: ``num_draft[b]`` ≤ K are real).
    Returns each sequence's emitted tokens: accepted drafts plus the target's next token.
    """
    k = draft.shape[1]
    real = torch.arange(k, device=draft.device).unsqueeze(0) < num_draft.unsqueeze(1)
    match = (draft == target[:, :k]) & real
    # Accepted = length of the all-true prefix; accepted drafts equal the target's tokens,
    # so the emitted tokens are simply the target's first accepted+1 tokens.
    accepted = match.int().cumprod(dim=1).sum(dim=1)
    rows = target.tolist()
    return [row[: n + 1] for row, n in zip(rows, accepted.tolist(), strict=True)]


def verify_sampled(
    p: torch.Tensor,  # [K+1, V] target probabilities (after temperature / top-k / top-p)
    q: torch.Tensor,  # [K, V] draft probabilities the drafts were sampled from
    draft: list[int],  # K proposed tokens
    generator: torch.Generator | None,
) -> list[int]:
    """Rejection sampling for one sequence; returns the emitted tokens (1..K+1 of them)."""
    out: list[int] = []
    for i, x in enumerate(draft):
        r = torch.rand((), generator=generator, device=p.device)
        px, qx = p[i, x], q[i, x]
        if qx > 0 and px > 0 and r * qx <= px:  # r < min(1, p/q) without dividing by zero (p = 0: never)
            out.append(x)
            continue
        residual = (p[i] - q[i]).clamp_min(0)
        total = residual.sum()
        # p ≤ q everywhere only when p == q, and then rejection has probability 0; guard anyway.
        dist = residual / total if total > 0 else p[i]
        out.append(int(torch.multinomial(dist, 1, generator=generator)))
        return out
    out.append(int(torch.multinomial(p[len(draft)], 1, generator=generator)))
    return out


def overlap(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Σ_x min(p, q) per row: a drafter's acceptance probability at a position when sampling
    (HedgeSpec Thm 1: 1 − TV(p, q))."""
    return torch.minimum(p, q).sum(-1)


def greedy_acceptance(predicted: list[int], verified: list[int]) -> float:
    """Full-information feedback (HedgeSpec, greedy case): the fraction of verified positions
    where a drafter's argmax prediction equals the token the target kept."""
    if not verified:
        return 0.0
    hits = sum(1 for a, b in zip(predicted, verified, strict=False) if a == b)
    return hits / len(verified)


def verify_batch(candidates: list[Candidate], eos: frozenset[int] = frozenset()) -> list[Verified]:
    """The target's choice for every candidate of a step, drafts or not, in order.

    Greedy candidates are verified together on their argmax; sampled ones by rejection
    sampling with their own generators, after one batched warping of all their rows. A
    candidate without drafts simply gets the target's token. ``Verified.p`` keeps a sampled
    candidate's warped target probabilities (for counterfactual scoring). A candidate whose
    request asks for logits processors (penalties, logit_bias, min_tokens) is verified on its
    processed rows (worker/engine/processors.py), drafts and all.
    """
    out: list[Verified | None] = [None] * len(candidates)
    rows_of = {
        i: process_rows(c.logits, c.seq, _draft_tokens(c), eos)
        for i, c in enumerate(candidates)
        if c.seq.params.processed
    }
    greedy = [i for i, c in enumerate(candidates) if c.seq.params.greedy]
    if greedy:
        drafts = [_draft_tokens(candidates[i]) for i in greedy]
        k = max(len(d) for d in drafts)
        ids = [rows_of[i].argmax(-1).tolist() if i in rows_of else candidates[i].argmax for i in greedy]
        target = torch.tensor([t + [0] * (k + 1 - len(t)) for t in ids])
        draft = torch.tensor([d + [-1] * (k - len(d)) for d in drafts], dtype=torch.long)
        num = torch.tensor([len(d) for d in drafts])
        for i, emitted in zip(greedy, verify_greedy(target, draft.view(len(greedy), k), num), strict=True):
            out[i] = Verified(candidates[i], emitted, None)
    sampled = [i for i, c in enumerate(candidates) if not c.seq.params.greedy]
    if sampled:
        # One batched warping for every row; draws happen on the CPU with each request's generator.
        rows = [
            rows_of[i].to(candidates[i].logits.dtype) if i in rows_of else candidates[i].logits
            for i in sampled
        ]
        row_params = [
            candidates[i].seq.params for i, r in zip(sampled, rows, strict=True) for _ in range(r.shape[0])
        ]
        probs = filtered_probs(torch.cat(rows), row_params).cpu()
        at = 0
        for i in sampled:
            c = candidates[i]
            p = probs[at : at + c.logits.shape[0]]
            at += p.shape[0]
            tokens = _draft_tokens(c)
            q = c.drafted.q if c.drafted else None
            if q is None:  # a point mass on each draft
                q = torch.zeros(len(tokens), p.shape[1])
                q[torch.arange(len(tokens)), torch.tensor(tokens, dtype=torch.long)] = 1.0
            out[i] = Verified(c, verify_sampled(p, q, tokens, c.seq.generator), p)
    return [v for v in out if v is not None]


def _draft_tokens(c: Candidate) -> list[int]:
    return c.drafted.tokens if c.drafted else []
