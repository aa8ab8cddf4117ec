"""Distillation of a drafter from its target: a fixed set of windows with the teacher's soft labels.

The set is the domain's training text cut into windows plus the target's own greedy
continuations of prompts drawn from it (what speculative decoding actually feeds the drafter).
The teacher's top-k soft labels are computed once and kept in memory, so several epochs of
student training cost one teacher pass.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from training.batches import RowSampler, WindowSampler, chunk_windows
from training.generate import LabelledSeq, greedy_continue, teacher_topk
from training.trainer import Batch, LoopConfig, TrainLog, distill_loss, train_loop

PROMPT_LEN = 32


@dataclass
class DistillSet:
    windows: torch.Tensor  # [n, seq_len + 1] token ids
    topk_ids: torch.Tensor  # [n, seq_len, k] int32
    topk_probs: torch.Tensor  # [n, seq_len, k] float16
    generated_rows: int  # how many of the windows are teacher continuations
    teacher_seconds: float  # spent on continuations and soft labels
    weights: torch.Tensor | None = None  # per-row sampling weights; None: uniform

    def batches(self, batch_size: int, seed: int) -> Callable[[], Batch]:
        rows = RowSampler(self.windows.shape[0], seed, self.weights)

        def next_batch() -> Batch:
            idx = rows.sample(batch_size)
            w = self.windows[idx]
            return {
                "input_ids": w[:, :-1],
                "labels": w[:, 1:],
                "topk_ids": self.topk_ids[idx].long(),
                "topk_probs": self.topk_probs[idx],
            }

        return next_batch


def build_distill_set(teacher: PreTrainedModel, stream: torch.Tensor, seq_len: int, topk: int,
                      continuations: int, seed: int, max_windows: int | None = None,
                      log: Callable[[str], None] = print) -> DistillSet:
    """Windows of ``stream`` plus ``continuations`` teacher-written rows, all soft-labelled."""
    start = time.perf_counter()
    text = chunk_windows(stream, seq_len)
    if max_windows is not None and text.shape[0] > max_windows:
        # A seeded subset, so a capped set still covers every part of a multi-domain stream.
        keep = torch.randperm(text.shape[0], generator=torch.Generator().manual_seed(seed))[:max_windows]
        text = text[keep.sort().values]
    parts = [text]
    if continuations > 0:
        prompts = WindowSampler(stream, PROMPT_LEN - 1, seed).sample(continuations)
        parts.append(greedy_continue(teacher, prompts, seq_len + 1 - PROMPT_LEN))
        log(f"  {continuations} teacher continuations in {time.perf_counter() - start:.0f}s")
    windows = torch.cat(parts)
    ids, probs = teacher_topk(teacher, windows, topk)
    seconds = time.perf_counter() - start
    log(f"  teacher top-{topk} labels for {windows.shape[0]} windows in {seconds:.0f}s")
    return DistillSet(windows, ids, probs, continuations, seconds)


def distill(student: PreTrainedModel, data: DistillSet, batch_size: int, cfg: LoopConfig, seed: int,
            log: Callable[[str], None] = print) -> TrainLog:
    """Trains ``student`` to match the teacher's soft labels (KL over the top-k)."""
    return train_loop(student, data.batches(batch_size, seed), distill_loss, cfg, log)


def one_hot_rows(windows: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Hard labels in the soft-label layout: the true next token with probability 1."""
    n, width = windows.shape[0], windows.shape[1] - 1
    ids = torch.zeros(n, width, k, dtype=torch.int32)
    probs = torch.zeros(n, width, k, dtype=torch.float16)
    ids[..., 0] = windows[:, 1:].to(torch.int32)
    probs[..., 0] = 1.0
    return ids, probs


def labelled_rows(seqs: list[LabelledSeq], seq_len: int, pad_id: int) -> tuple[torch.Tensor, ...]:
    """Teacher-labelled sequences as fixed windows: truncated or padded (with no label) to seq_len."""
    k = seqs[0].topk_ids.shape[1]
    windows = torch.full((len(seqs), seq_len + 1), pad_id, dtype=torch.long)
    ids = torch.zeros(len(seqs), seq_len, k, dtype=torch.int32)
    probs = torch.zeros(len(seqs), seq_len, k, dtype=torch.float16)
    for r, seq in enumerate(seqs):
        tokens = seq.tokens[:seq_len + 1]
        windows[r, :len(tokens)] = torch.tensor(tokens)
        ids[r, :len(tokens) - 1] = seq.topk_ids[:len(tokens) - 1]
        probs[r, :len(tokens) - 1] = seq.topk_probs[:len(tokens) - 1]
    return windows, ids, probs
