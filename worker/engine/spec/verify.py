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

from shared.schemas import SamplingParams
from worker.engine.sampler import filtered_probs


def verify_greedy(
    target_logits: torch.Tensor, draft: torch.Tensor, num_draft: torch.Tensor
) -> list[list[int]]:
    """Batched greedy verification.

    target_logits: [B, K+1, V] target scores at the K draft positions and the one after.
    draft: [B, K] proposed tokens (rows may be shorter: ``num_draft[b]`` ≤ K are real).
    Returns each sequence's emitted tokens: accepted drafts plus the target's next token.
    """
    return verify_greedy_ids(target_logits.argmax(-1), draft, num_draft)


def verify_greedy_ids(target: torch.Tensor, draft: torch.Tensor, num_draft: torch.Tensor) -> list[list[int]]:
    """``verify_greedy`` on the target's argmax tokens ``[B, K+1]`` instead of its logits."""
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
        if qx > 0 and r * qx <= px:  # r < min(1, p/q) without dividing by zero
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


def verify_batch(
    target_ids: list[list[int]],
    rows: list[torch.Tensor],
    drafts: list[list[int]],
    q: list[torch.Tensor | None],
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
) -> tuple[list[list[int]], list[torch.Tensor | None]]:
    """The target's choice for every sequence of a step, drafts or not.

    Per sequence: ``rows[i]`` its ``[k+1, V]`` target logits (k = len(drafts[i]), 0 for a
    plain decode or the end of a prefill), ``target_ids[i]`` their argmax (used when greedy),
    ``q[i]`` the ``[k, V]`` probabilities its drafts were drawn from (None: a deterministic
    proposal, i.e. a point mass). Returns the emitted tokens (1..k+1) and, for sampled
    sequences, the warped target probabilities (for counterfactual scoring).
    """
    n = len(rows)
    emitted: list[list[int]] = [[] for _ in range(n)]
    p_rows: list[torch.Tensor | None] = [None] * n
    greedy = [i for i in range(n) if params[i].greedy]
    if greedy:
        k = max(len(drafts[i]) for i in greedy)
        target = torch.tensor([target_ids[i] + [0] * (k + 1 - len(target_ids[i])) for i in greedy])
        draft = torch.tensor([drafts[i] + [-1] * (k - len(drafts[i])) for i in greedy], dtype=torch.long)
        num = torch.tensor([len(drafts[i]) for i in greedy])
        for i, out in zip(greedy, verify_greedy_ids(target, draft.view(len(greedy), k), num), strict=True):
            emitted[i] = out
    sampled = [i for i in range(n) if not params[i].greedy]
    if sampled:
        # One batched warping for every row; draws happen on the CPU with each request's generator.
        row_params = [params[i] for i in sampled for _ in range(rows[i].shape[0])]
        probs = filtered_probs(torch.cat([rows[i] for i in sampled]), row_params).cpu()
        at = 0
        for i in sampled:
            p = probs[at : at + rows[i].shape[0]]
            at += p.shape[0]
            qi = q[i]
            if qi is None:  # a point mass on each draft
                qi = torch.zeros(len(drafts[i]), p.shape[1])
                qi[torch.arange(len(drafts[i])), torch.tensor(drafts[i], dtype=torch.long)] = 1.0
            emitted[i] = verify_sampled(p, qi, drafts[i], generators[i])
            p_rows[i] = p
    return emitted, p_rows
