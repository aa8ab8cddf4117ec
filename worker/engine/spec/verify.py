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


def verify_greedy(
    target_logits: torch.Tensor, draft: torch.Tensor, num_draft: torch.Tensor
) -> list[list[int]]:
    """Batched greedy verification.

    target_logits: [B, K+1, V] target scores at the K draft positions and the one after.
    draft: [B, K] proposed tokens (rows may be shorter: ``num_draft[b]`` ≤ K are real).
    Returns each sequence's emitted tokens: accepted drafts plus the target's next token.
    """
    target = target_logits.argmax(-1)  # [B, K+1]
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


def greedy_acceptance(predicted: list[int], verified: list[int]) -> float:
    """Full-information feedback (HedgeSpec, greedy case): the fraction of verified positions
    where a drafter's argmax prediction equals the token the target kept."""
    if not verified:
        return 0.0
    hits = sum(1 for a, b in zip(predicted, verified, strict=False) if a == b)
    return hits / len(verified)
