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
from training.generate import greedy_continue, teacher_topk
from training.trainer import Batch, LoopConfig, TrainLog, distill_loss, train_loop

PROMPT_LEN = 32


@dataclass
class DistillSet:
    windows: torch.Tensor  # [n, seq_len + 1] token ids
    topk_ids: torch.Tensor  # [n, seq_len, k] int32
    topk_probs: torch.Tensor  # [n, seq_len, k] float16
    generated_rows: int  # how many of the windows are teacher continuations
    teacher_seconds: float  # spent on continuations and soft labels

    def batches(self, batch_size: int, seed: int) -> Callable[[], Batch]:
        rows = RowSampler(self.windows.shape[0], seed)

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
