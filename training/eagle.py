"""Training EAGLE-style feature heads on the target's own continuations and features.

Vocabulary: each head drafts over a reduced, frequency-ranked vocabulary — the ``draft_vocab``
tokens the target emits most often in that head's training continuations (ties by id). On this
CPU the full 49,152 × 576 output layer would cost a drafted position ~7 ms, most of a draft;
an 8,192-row slice of the same (tied) matrix costs a sixth, and covers almost all of what the
target emits (the coverage is measured and reported). The rows are the target's own: the head
stores only their ids, and the engine gathers them from the target's embedding at load.

Loss, per chained pass ``s`` (``EagleHead.chain``; ``s > 0`` is the training-time test) and per
position whose next token the target generated: cross-entropy to the target's next-token
distribution renormalised over the head's vocabulary (softmax of ``f_{i+s+1} · E_vocab``) plus
``reg`` × smooth-L1 between the head's output and the target's next feature.
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm import tqdm

from training.eagle_data import FeatureSeq
from training.eagle_head import EagleHead


@dataclass(frozen=True)
class HeadRecipe:
    name: str
    train_sets: tuple[str, ...]  # tags of target_sets it trains on
    other_sets: tuple[str, ...] = ()  # mixed in at ``other_share`` of the batches (robustness)
    other_share: float = 0.2
    steps: int = 150
    batch_size: int = 8
    lr: float = 2e-3
    warmup: int = 15
    ttt_steps: int = 1  # extra chained passes trained (EAGLE-3's training-time test)
    reg: float = 0.2
    noise: float = 0.02  # gaussian feature noise, relative to the features' RMS
    max_len: int = 320  # tokens per training row


@dataclass
class TrainResult:
    steps: int
    seconds: float
    first_loss: float
    last_loss: float
    positions: int  # loss positions seen (pass 0)


def select_vocab(seqs: list[FeatureSeq], size: int, target_vocab: int) -> torch.Tensor:
    """The ``size`` tokens the target emits most in ``seqs`` (then prompt tokens, then by id)."""
    gen = Counter(t for s in seqs for t in s.tokens[s.prompt_len:])
    prompt = Counter(t for s in seqs for t in s.tokens[:s.prompt_len])
    order = sorted(range(target_vocab), key=lambda t: (-gen[t], -prompt[t], t))
    return torch.tensor(sorted(order[:min(size, target_vocab)]), dtype=torch.long)


def coverage(seqs: list[FeatureSeq], vocab_ids: torch.Tensor) -> float:
    """Share of generated tokens inside the vocabulary (a ceiling on greedy acceptance)."""
    ids = set(vocab_ids.tolist())
    gen = [t for s in seqs for t in s.tokens[s.prompt_len:]]
    return sum(t in ids for t in gen) / max(1, len(gen))


def collate(seqs: list[FeatureSeq], extra: int, max_len: int) -> tuple[torch.Tensor, ...]:
    """Padded ``feats [B, T + extra + 1, H]``, ``tokens [B, T + extra]`` (x_1 ..), ``lens`` and
    ``prompt lens``; long rows keep their last ``max_len`` tokens (their features too)."""
    rows = []
    for s in seqs:
        cut = max(0, len(s.tokens) - max_len)
        rows.append((s.tokens[cut:], s.features[cut:].float(), max(1, s.prompt_len - cut)))
    t = max(len(r[0]) for r in rows) - 1
    h = rows[0][1].shape[1]
    feats = torch.zeros(len(rows), t + extra + 1, h)
    tokens = torch.zeros(len(rows), t + extra, dtype=torch.long)
    for b, (toks, f, _) in enumerate(rows):
        feats[b, :f.shape[0]] = f
        tokens[b, :len(toks) - 1] = torch.tensor(toks[1:])
    lens = torch.tensor([len(r[0]) for r in rows])
    plens = torch.tensor([r[2] for r in rows])
    return feats, tokens, lens, plens


def chain_loss(head: EagleHead, batch: tuple[torch.Tensor, ...], steps: int, reg: float,
               noise: float = 0.0, gen: torch.Generator | None = None) -> tuple[torch.Tensor, int]:
    feats, tokens, lens, plens = batch
    s_max = steps
    t = feats.shape[1] - s_max - 1
    inp = feats[:, :t]
    if noise > 0:
        rms = inp.pow(2).mean().sqrt()
        inp = inp + noise * rms * torch.randn(inp.shape, generator=gen)
    outs = head.chain(inp, tokens, s_max)
    with torch.no_grad():
        target_logp = torch.log_softmax(head.logits(feats[:, 1:]), dim=-1)  # row j: x_{j+2}
    i = torch.arange(t)
    total = feats.new_zeros(())
    count = 0
    for s, h in enumerate(outs):
        # Row i of pass s predicts x_{i+s+2}; needs i+s+2 ≤ n−1 and x_{i+s+2} generated.
        valid = ((i[None] + s + 2) <= (lens[:, None] - 1)) & ((i[None] + s + 2) >= plens[:, None])
        if not bool(valid.any()):
            continue
        p = target_logp[:, s:s + t][valid].exp()
        logq = torch.log_softmax(head.logits(h[valid]), dim=-1)
        ce = -(p * logq).sum(-1).mean()
        r = F.smooth_l1_loss(h[valid], feats[:, s + 1:s + 1 + t][valid])
        total = total + (0.8 ** s) * (ce + reg * r)
        if s == 0:
            count = int(valid.sum())
    return total, count


def _lr(step: int, recipe: HeadRecipe) -> float:
    if step < recipe.warmup:
        return recipe.lr * (step + 1) / recipe.warmup
    frac = (step - recipe.warmup) / max(1, recipe.steps - recipe.warmup)
    return recipe.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def train_head(head: EagleHead, main: list[FeatureSeq], other: list[FeatureSeq], recipe: HeadRecipe,
               seed: int, steps: int | None = None, progress: bool = True) -> TrainResult:
    """AdamW with warmup and cosine decay; deterministic given ``seed`` and the data."""
    torch.manual_seed(seed)
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=recipe.lr, weight_decay=0.01, betas=(0.9, 0.95))
    n_steps = steps or recipe.steps
    first = last = float("nan")
    positions = 0
    order: list[int] = []
    t0 = time.perf_counter()
    bar = tqdm(range(n_steps), desc=recipe.name, disable=not progress, mininterval=5.0)
    for step in bar:
        pick: list[FeatureSeq] = []
        for _ in range(recipe.batch_size):
            if other and rng.random() < recipe.other_share:
                pick.append(other[rng.randrange(len(other))])
                continue
            if not order:
                order = list(range(len(main)))
                rng.shuffle(order)
            pick.append(main[order.pop()])
        for g in opt.param_groups:
            g["lr"] = _lr(step, recipe)
        batch = collate(pick, recipe.ttt_steps, recipe.max_len)
        loss, count = chain_loss(head, batch, recipe.ttt_steps, recipe.reg, recipe.noise, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        positions += count
        last = float(loss.detach())
        first = last if step == 0 else first
        bar.set_postfix(loss=f"{last:.3f}")
    bar.close()
    return TrainResult(n_steps, time.perf_counter() - t0, first, last, positions)


@torch.no_grad()
def accepted_lengths(head: EagleHead, seqs: list[FeatureSeq], gamma: int) -> list[list[tuple[int, int]]]:
    """Per sequence, ``(L, accepted)`` for a chain of ``gamma`` drafts after each position ``L``
    past the first generated token (first draft = x_L), the real past teacher-forced, as the
    engine drafts after a verification."""
    ids = head.vocab_ids
    out = []
    for s in seqs:
        feats, tokens, lens, plens = collate([s], gamma - 1, 10**9)
        t = feats.shape[1] - gamma
        outs = head.chain(feats[:, :t], tokens, gamma - 1)
        preds = [ids[head.logits(h[0]).argmax(-1)].tolist() for h in outs]  # pass a, row i: x_{i+a+2}
        n, p0 = int(lens[0]), int(plens[0])
        row = []
        for start in range(max(p0 + 1, 2), n):  # first draft at position start, from row start−2
            i, acc = start - 2, 0
            while acc < gamma and start + acc < n and preds[acc][i] == s.tokens[start + acc]:
                acc += 1
            row.append((start, acc))
        out.append(row)
    return out


def alpha_from_e(e: float, gamma: int) -> float:
    """Per-position α solving E = (1 − α^(γ+1)) / (1 − α) (bisection)."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        val = gamma + 1 if mid >= 1 else (1 - mid ** (gamma + 1)) / (1 - mid)
        lo, hi = (mid, hi) if val < e else (lo, mid)
    return (lo + hi) / 2


def measure(head: EagleHead, seqs: list[FeatureSeq], gammas: tuple[int, ...] = (1, 2, 4, 8)
            ) -> dict[int, dict[str, float]]:
    """γ → {E: tokens per verification, alpha}. A draft at a position near the end is cut
    short by the continuation, so E counts only positions with a full γ of target tokens after."""
    res = {}
    for g in gammas:
        rows = accepted_lengths(head, seqs, g)
        full = [a for s, row in zip(seqs, rows, strict=True)
                for start, a in row if start + g <= len(s.tokens)]
        e = 1 + sum(full) / max(1, len(full))
        res[g] = {"E": round(e, 3), "alpha": round(alpha_from_e(e, g), 3), "positions": len(full)}
    return res


def ngram_measure(seqs: list[FeatureSeq], gammas: tuple[int, ...] = (1, 2, 4, 8)
                  ) -> dict[int, dict[str, float]]:
    """The engine's prompt-lookup drafter on the same continuations, measured the same way."""
    from worker.engine.spec.ngram import ngram_propose

    res = {}
    for g in gammas:
        acc = []
        for s in seqs:
            for start in range(max(s.prompt_len + 1, 2), len(s.tokens) - g + 1):
                prop = ngram_propose(s.tokens[:start], g)
                n = 0
                while n < len(prop) and prop[n] == s.tokens[start + n]:
                    n += 1
                acc.append(n)
        e = 1 + sum(acc) / max(1, len(acc))
        res[g] = {"E": round(e, 3), "alpha": round(alpha_from_e(e, g), 3), "positions": len(acc)}
    return res
