"""Next-token choice: greedy (argmax), or temperature → top-k → top-p → a draw.

Filtering is batched over rows. A seeded request's draw is keyed on (seed, output position)
(keyed.py): the same tokens whatever else is in the batch, whatever γ, drafter, preemption or
resume, and speculative verification keeps a draft exactly when it equals that draw. An
unseeded one draws from its own ``torch.Generator`` and is verified by rejection sampling.
``filtered_probs`` is the target distribution both verifications use.

Guards (a request must never crash the engine): a positive temperature is raised to
``TEMPERATURE_FLOOR`` (float32 would turn 1e-300 into 0 and the logits into inf/NaN), and
probabilities that are not finite raise a ``ValueError`` that the engine fails alone.
"""

from __future__ import annotations

import torch

from shared.schemas import TEMPERATURE_FLOOR, SamplingParams
from worker.engine.keyed import keyed_draw


def is_keyed(params: SamplingParams) -> bool:
    """A sampled request with a seed: its tokens are keyed draws (see the module docstring)."""
    return not params.greedy and params.seed is not None


def new_generator(params: SamplingParams) -> torch.Generator:
    gen = torch.Generator()
    if params.seed is not None:
        gen.manual_seed(params.seed)
    else:
        gen.seed()
    return gen


def filtered_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """``[N, V]`` fp32 probabilities after temperature, top-k and top-p (rows sampled)."""
    x = logits.float()
    temps = torch.tensor([max(p.temperature, TEMPERATURE_FLOOR) for p in params], device=x.device).unsqueeze(
        1
    )
    x = x / temps
    top_k = [p.top_k if 0 < p.top_k < x.shape[1] else 0 for p in params]
    if any(top_k):
        k_max = max(top_k)
        kth = torch.topk(x, k_max, dim=1).values  # [N, k_max], descending
        idx = torch.tensor([max(k, 1) - 1 for k in top_k], device=x.device).unsqueeze(1)
        threshold = kth.gather(1, idx)
        limited = torch.tensor([k > 0 for k in top_k], device=x.device).unsqueeze(1)
        # Ties with the k-th value are kept, as transformers does.
        x = x.masked_fill(limited & (x < threshold), float("-inf"))
    probs = torch.softmax(x, dim=1)
    top_p = [p.top_p for p in params]
    if any(p < 1.0 for p in top_p):
        sorted_p, order = torch.sort(probs, dim=1, descending=True)
        mass_before = torch.cumsum(sorted_p, dim=1) - sorted_p
        limit = torch.tensor(top_p, device=x.device).unsqueeze(1)
        # Keep the smallest head of the ranking whose mass reaches top_p (at least one).
        drop_sorted = mass_before >= limit
        drop_sorted[:, 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(dim=1, keepdim=True)
    if not bool(torch.isfinite(probs).all()):
        raise ValueError("the model's logits gave probabilities that are not finite")
    return probs


def draw(
    probs: torch.Tensor,
    params: list[SamplingParams],
    positions: list[int],
    generators: list[torch.Generator | None],
) -> list[int]:
    """One token per row of ``probs [N, V]`` (``filtered_probs``, on the CPU): a seeded row's
    keyed draw at its output position ``positions[i]``, any other row's from ``generators[i]``."""
    out = [0] * len(params)
    keyed = [i for i, p in enumerate(params) if is_keyed(p)]
    if keyed:
        seeds = [params[i].seed or 0 for i in keyed]
        tokens = keyed_draw(
            probs[keyed] if len(keyed) < len(params) else probs, seeds, [positions[i] for i in keyed]
        )
        for i, tok in zip(keyed, tokens, strict=True):
            out[i] = tok
    for i, p in enumerate(params):
        if not is_keyed(p):
            out[i] = int(torch.multinomial(probs[i], 1, generator=generators[i]))
    return out


def sample(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
    positions: list[int],
) -> list[int]:
    """One token per row of ``logits [N, V]``; ``positions``: each row's output position (what
    a seeded row's draw is keyed on)."""
    out = [0] * len(params)
    greedy = [i for i, p in enumerate(params) if p.greedy]
    if greedy:
        rows = logits if len(greedy) == len(params) else logits[greedy]
        for i, tok in zip(greedy, rows.argmax(dim=1).tolist(), strict=True):
            out[i] = tok
    sampled = [i for i, p in enumerate(params) if not p.greedy]
    if sampled:
        # Draws happen on the CPU, where the requests' generators live.
        probs = filtered_probs(logits[sampled], [params[i] for i in sampled]).cpu()
        tokens = draw(
            probs,
            [params[i] for i in sampled],
            [positions[i] for i in sampled],
            [generators[i] for i in sampled],
        )
        for i, tok in zip(sampled, tokens, strict=True):
            out[i] = tok
    return out
