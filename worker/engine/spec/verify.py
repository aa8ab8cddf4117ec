"""The verification step of speculative decoding.

The target scored γ draft tokens plus one more position in a single forward. Greedy keeps
the longest prefix of drafts that equal the target's argmax, then the target's own token.

A seeded sampled request is verified the same way on its keyed draws (keyed.py): row i's
token is the target's own draw at the draft's output position — a function of the seed, that
position and the target's warped row alone — and a draft stands exactly when it equals it.
The emitted tokens are then the very tokens the target alone draws with that seed, at any γ,
with any drafter (and so distributed as the target's).

An unseeded one goes through standard speculative rejection sampling (Leviathan et al. 2023;
Chen et al. 2023): accept draft x with probability min(1, p(x)/q(x)); on the first rejection
draw from normalise(max(0, p − q)) and stop; if all pass, draw a bonus token from the last p.
The emitted tokens are distributed exactly as sampling from the target alone, and it accepts
Σ min(p, q) of the drafts, at least what the keyed draws' coupling accepts
(docs/speculation.md "Seeded sampling" measures both).
"""

from __future__ import annotations

import torch

from worker.engine.keyed import keyed_draw
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

    Greedy candidates are verified together on their argmax, and seeded sampled ones with
    them on their keyed draws; unseeded sampled ones by rejection sampling with their own
    generators. Every sampled row is warped in one batch. A candidate without drafts simply
    gets the target's token. ``Verified.p`` keeps a sampled candidate's warped target
    probabilities (for counterfactual scoring). A candidate whose request asks for logits
    processors (penalties, logit_bias, min_tokens) is verified on its processed rows
    (worker/engine/processors.py), drafts and all.
    """
    out: list[Verified | None] = [None] * len(candidates)
    rows_of = {
        i: process_rows(c.logits, c.seq, _draft_tokens(c), eos)
        for i, c in enumerate(candidates)
        if c.seq.params.processed
    }
    probs_of = _warped(candidates, rows_of)
    chosen = {  # per greedy or keyed candidate: the target's token at every row
        i: rows_of[i].argmax(-1).tolist() if i in rows_of else c.argmax
        for i, c in enumerate(candidates)
        if c.seq.params.greedy
    } | _keyed_draws(candidates, probs_of)
    if chosen:
        order = sorted(chosen)
        drafts = [_draft_tokens(candidates[i]) for i in order]
        k = max(len(d) for d in drafts)
        target = torch.tensor([chosen[i] + [0] * (k + 1 - len(chosen[i])) for i in order])
        draft = torch.tensor([d + [-1] * (k - len(d)) for d in drafts], dtype=torch.long)
        num = torch.tensor([len(d) for d in drafts])
        for i, emitted in zip(order, verify_greedy(target, draft.view(len(order), k), num), strict=True):
            out[i] = Verified(candidates[i], emitted, probs_of.get(i))
    for i, p in probs_of.items():
        if i in chosen:
            continue
        c = candidates[i]
        tokens = _draft_tokens(c)
        q = c.drafted.q if c.drafted else None
        if q is None:  # a point mass on each draft
            q = torch.zeros(len(tokens), p.shape[1])
            q[torch.arange(len(tokens)), torch.tensor(tokens, dtype=torch.long)] = 1.0
        out[i] = Verified(c, verify_sampled(p, q, tokens, c.seq.generator), p)
    return [v for v in out if v is not None]


def _warped(candidates: list[Candidate], rows_of: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
    """Every sampled candidate's warped target rows (one batched ``filtered_probs``, on the CPU)."""
    sampled = [i for i, c in enumerate(candidates) if not c.seq.params.greedy]
    if not sampled:
        return {}
    rows = [
        rows_of[i].to(candidates[i].logits.dtype) if i in rows_of else candidates[i].logits for i in sampled
    ]
    row_params = [
        candidates[i].seq.params for i, r in zip(sampled, rows, strict=True) for _ in range(r.shape[0])
    ]
    probs = filtered_probs(torch.cat(rows), row_params).cpu()
    out, at = {}, 0
    for i, r in zip(sampled, rows, strict=True):
        out[i] = probs[at : at + r.shape[0]]
        at += r.shape[0]
    return out


def _keyed_draws(candidates: list[Candidate], probs_of: dict[int, torch.Tensor]) -> dict[int, list[int]]:
    """The keyed draw at every row of each seeded sampled candidate, all in one batch: row j
    of a candidate whose first emitted token lands at index ``L`` is output position
    ``seq.position(L) + j``."""
    keyed = [i for i in probs_of if candidates[i].seq.keyed]
    if not keyed:
        return {}
    seeds: list[int] = []
    positions: list[int] = []
    for i in keyed:
        seq = candidates[i].seq
        first = seq.position(len(seq.token_ids))  # its drafts are not among its tokens
        n = probs_of[i].shape[0]
        seeds += [seq.params.seed or 0] * n
        positions += range(first, first + n)
    tokens = keyed_draw(torch.cat([probs_of[i] for i in keyed]), seeds, positions)
    out, at = {}, 0
    for i in keyed:
        n = probs_of[i].shape[0]
        out[i] = tokens[at : at + n]
        at += n
    return out


def _draft_tokens(c: Candidate) -> list[int]:
    return c.drafted.tokens if c.drafted else []
