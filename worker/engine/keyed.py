"""Seeded draws that speculation cannot change: randomness keyed on (seed, output position).

Why: with one ``torch.Generator`` per request, the random numbers a token consumes depend on
how many were drawn before it — by γ, the drafter's proposals and every rejection — so the
same seed gave different text under a different speculation schedule. Here each sampled token
of a seeded request is a pure function of the seed, its output position (the index of the
token in the job's output: a failover resume continues the count) and the target's warped
probabilities at that position. Verification then keeps a draft exactly when it equals the
target's own draw at its position (``spec/verify.py``): the emitted sequence is the one the
target alone emits with that seed, at any γ, with any drafter, after a preemption or a resume.

The draw is the exponential race (the Gumbel-max trick in another form): each token v runs a
clock E_v / p_v with E_v ~ Exp(1) independent, and the earliest wins — v with probability p_v
exactly. E_v = −log U_v, and U_v comes from Philox-4x32-10 (nj_kernels/philox.py; the
generator of cuRAND and JAX), a counter-based generator: counter (v // 4, position, stream),
key = the seed, word v % 4 of the output. A drafter that draws from its own distribution with
the same noise (``spec/model_drafter.py``, ``spec/feature_drafter.py``) proposes the target's
own token wherever their races have the same winner: a coupled draft. Such a coupling agrees
with probability between (1 − TV)/(1 + TV) and 1 − TV, where rejection sampling reaches
1 − TV; no scheme whose target draw ignores the drafter does better in the worst case
(Daliri, Musco, Suresh, "Coupling without Communication and Drafter-Invariant Speculative
Decoding", 2024). docs/speculation.md measures what it costs on SmolLM2's heads.

Cost: only tokens of probability ≥ ``HEAD_FLOOR`` (2⁻²⁰) get their own clock; the rest of
the row (the tail) races as one group — the earliest of independent clocks E_v / p_v over a
set T is itself Exp(p_T)-distributed and its winner is v with probability p_v / p_T,
independently of when — so the tail's clock is one more uniform, and only when it wins is
its token found by inverse CDF over the tail (token id order) with another. The draw is still
exactly p. A tail token is coupled between target and drafter only through those two
uniforms, which costs acceptance at most the tail's mass (≤ V · 2⁻²⁰: under 5 % on SmolLM2's
vocabulary, 0.2 % measured at temperature 1). On the CPU the whole draw is one C call
(``nj_kernels/philox.c``: it skips the log of a clock whose bound (1 − U_v) / p_v is already
later than the earliest); elsewhere ``keyed_draw_torch``, vectorised over rows and tokens —
the two agree draw for draw (their logs may differ in the last bit, which changes a token only
on an exact tie).
"""

from __future__ import annotations

import torch

from nj_kernels import philox
from nj_kernels.philox import uniforms

HEAD_FLOOR = 2.0**-20  # tokens below this probability race as one group (see the module docstring)
STREAM_TOKEN = 0x4E4A0001  # Philox counter word 3 of a token's own clock
STREAM_TAIL = 0x4E4A0002  # ... of the tail's two uniforms (its clock, its token)


def keyed_draw(probs: torch.Tensor, seeds: list[int], positions: list[int]) -> list[int]:
    """One token per row of ``probs [N, V]`` (a distribution per row, e.g. ``filtered_probs``):
    row i is drawn with the noise of (``seeds[i]``, ``positions[i]``) — see the module
    docstring. The same probabilities, seed and position always give the same token. On the
    CPU one call of the kernel (nj_kernels/philox.c), elsewhere ``keyed_draw_torch``."""
    if probs.shape[0] == 0:
        return []
    drawn = philox.keyed_draw(probs, seeds, positions, HEAD_FLOOR, (STREAM_TOKEN, STREAM_TAIL))
    return drawn if drawn is not None else keyed_draw_torch(probs, seeds, positions)


def keyed_draw_torch(probs: torch.Tensor, seeds: list[int], positions: list[int]) -> list[int]:
    """The reference ``keyed_draw``, in torch ops on ``probs``' device: each head token's clock
    −log(U_v) / p_v, the tail's −log(U_tail) / p_tail (its mass summed in id order, as the
    kernel does), the earliest wins (ties: the lowest id)."""
    n, vocab = probs.shape
    if n == 0:
        return []
    dev = probs.device
    head = probs >= HEAD_FLOOR
    rows, ids = head.nonzero(as_tuple=True)
    clock = (
        -torch.log(uniforms(seeds, positions, rows, ids, STREAM_TOKEN).to(dev)) / probs[rows, ids].double()
    )
    best = torch.full((n,), float("inf"), dtype=torch.float64, device=dev).scatter_reduce(
        0, rows, clock, "amin"
    )
    won = clock == best[rows]
    token = torch.full((n,), vocab, dtype=torch.int64, device=dev).scatter_reduce(
        0, rows[won], ids[won], "amin"
    )
    cum = torch.where(head, 0.0, probs).double().cumsum(1)  # the tail's mass, in id order
    tail = cum[:, -1]
    every = torch.arange(n, device=dev).repeat_interleave(2)
    u_tail = uniforms(seeds, positions, every, torch.arange(2, device=dev).repeat(n), STREAM_TAIL)
    u_tail = u_tail.to(dev).view(n, 2)
    tail_clock = -torch.log(u_tail[:, 0]) / tail  # inf without a tail
    wins = (tail_clock < best).nonzero().flatten()
    if wins.numel():
        target = (u_tail[wins, 1] * tail[wins]).unsqueeze(1)
        pick = torch.searchsorted(cum[wins], target, right=True).squeeze(1).clamp(max=vocab - 1)
        token[wins] = pick
    return token.tolist()
