"""The optimisation loop shared by every model: AdamW, linear warmup, cosine decay.

The step count fixes the schedule, so a seed and a step count give one run. With a wall-clock
budget instead, the loop times its first steps and derives the step count from them; the
count it chose is returned so that the run can be repeated exactly with it.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from shared.progress import Progress

Batch = dict[str, torch.Tensor]
LossFn = Callable[[torch.Tensor, Batch], torch.Tensor]
CALIBRATION_STEPS = 8


@dataclass(frozen=True)
class LoopConfig:
    steps: int | None  # None: derive it from budget_s
    lr: float
    warmup: int
    budget_s: float | None = None
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    log_every: int = 25


@dataclass
class TrainLog:
    steps: int = 0
    tokens: int = 0
    seconds: float = 0.0
    losses: list[float] = field(default_factory=list)  # one mean per log interval

    @property
    def first_loss(self) -> float:
        return self.losses[0]

    @property
    def last_loss(self) -> float:
        return self.losses[-1]


def lm_loss(logits: torch.Tensor, batch: Batch) -> torch.Tensor:
    """Next-token cross-entropy against the hard labels."""
    return F.cross_entropy(logits.flatten(0, 1).float(), batch["labels"].flatten())


def distill_loss(logits: torch.Tensor, batch: Batch) -> torch.Tensor:
    """KL(teacher ‖ student) over the teacher's top-k tokens (renormalised), per labelled position.

    Positions whose k probabilities are all zero (padding) carry no label and are left out; a
    one-hot row (probability 1 on the true next token) turns the term into cross-entropy.
    """
    logp = F.log_softmax(logits.float(), dim=-1).gather(-1, batch["topk_ids"])
    p = batch["topk_probs"].float()
    per_position = (p * (torch.log(p.clamp_min(1e-20)) - logp)).sum(-1)
    labelled = (p.sum(-1) > 0).sum().clamp_min(1)
    return per_position.sum() / labelled


def lr_factor(step: int, total: int, warmup: int, min_ratio: float) -> float:
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def _optimizer(model: nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    # Norm gains and other vectors are not decayed; matrices (embeddings included) are.
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    keep = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": keep, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8)


def train_loop(model: nn.Module, next_batch: Callable[[], Batch], loss_fn: LossFn, cfg: LoopConfig,
               log: Callable[[str], None] = print) -> TrainLog:
    """Trains ``model`` in place and returns what happened."""
    if cfg.steps is None and cfg.budget_s is None:
        raise ValueError("give steps or budget_s")
    if cfg.steps is None and cfg.warmup < CALIBRATION_STEPS:
        # The calibration steps must lie inside the warmup, where the schedule does not
        # depend on the step count yet; otherwise a rerun with --steps would differ.
        raise ValueError(f"a budgeted run needs warmup >= {CALIBRATION_STEPS}")
    model.train()
    opt = _optimizer(model, cfg.lr, cfg.weight_decay)
    total = cfg.steps
    result = TrainLog()
    window: list[float] = []
    step_times: list[float] = []
    start = time.perf_counter()
    step = 0
    progress = Progress("  training", total, "steps", say=log)  # a line a second, with the ETA
    while total is None or step < total:
        t0 = time.perf_counter()
        factor = lr_factor(step, total or 10**9, cfg.warmup, cfg.min_lr_ratio)
        for group in opt.param_groups:
            group["lr"] = cfg.lr * factor
        batch = next_batch()
        logits = model(input_ids=batch["input_ids"]).logits
        loss = loss_fn(logits, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        step += 1
        result.tokens += batch["input_ids"].numel()
        window.append(loss.item())
        step_times.append(time.perf_counter() - t0)
        if total is None and step == CALIBRATION_STEPS and cfg.budget_s is not None:
            per_step = statistics.median(step_times[1:])
            total = max(step + 1, int(cfg.budget_s / per_step))
            log(f"  {per_step:.2f} s/step measured: training for {total} steps")
            progress.total = total
        if step % cfg.log_every == 0 or step == total:
            result.losses.append(sum(window) / len(window))
            window.clear()
            elapsed = time.perf_counter() - start
            log(f"  step {step}/{total} loss {result.losses[-1]:.4f} lr {cfg.lr * factor:.2e} {elapsed:.0f}s")
            progress.said_elsewhere()
        else:
            progress.update(step, f"loss {window[-1]:.4f}")
    result.steps = step
    result.seconds = time.perf_counter() - start
    model.eval()
    return result
