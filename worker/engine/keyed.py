"""Seeded draws that speculation cannot change: randomness keyed on (seed, output position).

Why: with one ``torch.Generator`` per request, the random numbers a token consumes depend on
how many were drawn before it — by γ, the drafter's proposals and every rejection — so the
same seed gave different text under a different speculation schedule. Here each sampled token
of a seeded request is a pure function of the seed, its output position (the index of the
token in the job's output: a failover resume continues the count) and the target's warped
probabilities at that position. Verification then keeps a draft exactly when it equals the
target's own draw at its position (``spec/verify.py``): the emitted sequence is the one the
target alone emits with that seed, at any γ, with any drafter, after a preemption or a resume.

The draw is the exponential race (Gumbel-max): token = argmin_v E_v / p_v with E_v ~ Exp(1)
independent, which picks v with probability p_v exactly. E_v = −log U_v, and U_v comes from
Philox-4x32-10 (nj_kernels/philox.py; the generator of cuRAND and JAX), a counter-based
generator: counter (v // 4, position, stream), key = the seed, word v % 4 of the output —
vectorised over rows and token ids (no loop over the vocabulary; torch ops on any device, one
C call on the CPU, the same numbers). A drafter that draws with the same noise
(``spec/model_drafter.py``, ``spec/feature_drafter.py``) proposes the target's own token
wherever their race has the same winner: a coupled draft.

Cost: only tokens of probability ≥ ``HEAD_FLOOR`` (2⁻²⁰) get their own clock; the rest of
the row (the tail) races as one group — the earliest of independent clocks E_v / p_v over a
set T is itself Exp(p_T)-distributed and its winner is v with probability p_v / p_T,
independently of when — so the tail's clock is one more uniform, and only when it wins is
its token found by inverse CDF over the tail (token id order) with another. The draw is still
exactly p; a few hundred clocks a row instead of the whole vocabulary (49,152 on SmolLM2).
A tail token is coupled between target and drafter only through those two uniforms, which
costs acceptance at most the tail's mass (≤ V · 2⁻²⁰, under 5 % on SmolLM2's vocabulary,
typically far less).
"""

from __future__ import annotations

import torch

from nj_kernels.philox import uniforms

HEAD_FLOOR = 2.0**-20  # tokens below this probability race as one group (see the module docstring)
STREAM_TOKEN = 0x4E4A0001  # Philox counter word 3 of a token's own clock
STREAM_TAIL = 0x4E4A0002  # ... of the tail's two uniforms (its clock, its token)


def keyed_draw(probs: torch.Tensor, seeds: list[int], positions: list[int]) -> list[int]:
    """One token per row of ``probs [N, V]`` (a distribution per row, e.g. ``filtered_probs``):
    row i is drawn with the noise of (``seeds[i]``, ``positions[i]``) — see the module
    docstring. The same probabilities, seed and position always give the same token."""
    n, vocab = probs.shape
    if n == 0:
        return []
    dev = probs.device
    head = probs >= HEAD_FLOOR
    rows, ids = head.nonzero(as_tuple=True)
    u = uniforms(seeds, positions, rows, ids, STREAM_TOKEN)
    # Gumbel-max form of the race: the largest log p_v − log E_v wins.
    score = torch.log(probs[rows, ids].double()) - torch.log(-torch.log(u))
    best = torch.full((n,), float("-inf"), dtype=torch.float64, device=dev)
    best = best.scatter_reduce(0, rows, score, "amax")
    won = score == best[rows]  # ties (probability 0) go to the lowest id, as argmax would
    token = torch.full((n,), vocab, dtype=torch.int64, device=dev)
    token = token.scatter_reduce(0, rows[won], ids[won], "amin")
    tail = torch.where(head, 0.0, probs).sum(1, dtype=torch.float64)
    every = torch.arange(n, device=dev).repeat_interleave(2)
    u_tail = uniforms(seeds, positions, every, torch.arange(2, device=dev).repeat(n), STREAM_TAIL).view(n, 2)
    tail_score = torch.log(tail) - torch.log(-torch.log(u_tail[:, 0]))  # −inf without a tail
    tail_wins = (tail_score > best).nonzero().flatten()
    if tail_wins.numel():
        cum = torch.where(head[tail_wins], 0.0, probs[tail_wins]).double().cumsum(1)
        target = (u_tail[tail_wins, 1] * cum[:, -1]).unsqueeze(1)
        pick = torch.searchsorted(cum, target, right=True).squeeze(1).clamp(max=vocab - 1)
        token[tail_wins] = pick
    return token.tolist()
