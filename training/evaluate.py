"""Held-out measurements: validation loss per domain, and drafter/target greedy agreement.

Agreement is measured two ways. Teacher-forced on held-out text: how often the drafter's
argmax equals the target's at each position. On continuations: the target greedily continues
held-out prompts, and we count how often the drafter predicts the target's next token — the
situation speculative decoding is in. ``accept_len_g4`` is the mean number of draft tokens a
greedy verifier would accept per step with γ=4 proposals, from those same continuations.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from training.batches import WindowSampler
from training.distill import PROMPT_LEN


@dataclass(frozen=True)
class EvalSet:
    """One domain's held-out material: windows for loss/agreement, prompts for continuations."""

    windows: torch.Tensor  # [n, seq_len + 1]
    prompts: torch.Tensor  # [m, PROMPT_LEN]


def make_eval_set(val_stream: torch.Tensor, seq_len: int, windows: int, prompts: int, seed: int) -> EvalSet:
    w = WindowSampler(val_stream, seq_len, seed).sample(windows)
    p = WindowSampler(val_stream, PROMPT_LEN - 1, seed + 1).sample(prompts)
    return EvalSet(w, p)


@torch.no_grad()
def _logits(model: PreTrainedModel, ids: torch.Tensor, batch_size: int = 16) -> torch.Tensor:
    return torch.cat([model(input_ids=c).logits.float() for c in ids.split(batch_size)])


@torch.no_grad()
def val_loss(model: PreTrainedModel, windows: torch.Tensor, batch_size: int = 16) -> float:
    """Mean next-token cross-entropy (nats/token) on the windows."""
    total, count = 0.0, 0
    for chunk in windows.split(batch_size):
        logits = model(input_ids=chunk[:, :-1]).logits.float()
        total += F.cross_entropy(logits.flatten(0, 1), chunk[:, 1:].flatten(), reduction="sum").item()
        count += chunk[:, 1:].numel()
    return total / count


def greedy_tokens(model: PreTrainedModel, windows: torch.Tensor) -> torch.Tensor:
    """The model's argmax next token at every input position of the windows."""
    return _logits(model, windows[:, :-1]).argmax(-1)


def forced_agreement(target_tokens: torch.Tensor, drafter: PreTrainedModel, windows: torch.Tensor) -> float:
    """Fraction of held-out positions where the drafter's argmax equals the target's."""
    return (greedy_tokens(drafter, windows) == target_tokens).float().mean().item()


@torch.no_grad()
def continuation_agreement(drafter: PreTrainedModel, seqs: torch.Tensor, prompt_len: int,
                           gamma: int = 4) -> tuple[float, float]:
    """(agreement, mean accepted length at γ) of the drafter on the target's own continuations."""
    pred = _logits(drafter, seqs[:, :-1]).argmax(-1)[:, prompt_len - 1:]
    hits = pred == seqs[:, prompt_len:]
    return hits.float().mean().item(), mean_accepted(hits.tolist(), gamma)


def mean_accepted(rows: list[list[bool]], gamma: int) -> float:
    """Mean draft tokens accepted per greedy verify step, replaying each row's hit pattern."""
    accepted: list[int] = []
    for row in rows:
        pos = 0
        while pos + gamma <= len(row):
            run = 0
            while run < gamma and row[pos + run]:
                run += 1
            accepted.append(run)
            # The verifier emits one token of its own after the accepted run.
            pos += run + 1
    return sum(accepted) / max(1, len(accepted))
