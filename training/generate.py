"""Teacher outputs used for distillation and evaluation: greedy continuations and top-k labels."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel


@torch.no_grad()
def greedy_continue(model: PreTrainedModel, prompts: torch.Tensor, new_tokens: int,
                    batch_size: int = 64) -> torch.Tensor:
    """Appends ``new_tokens`` greedy tokens to each (equal-length) prompt row.

    Unlike ``generate`` it does not stop at eos: a model that ends a document goes on to
    start the next one, which is still its own greedy text and useful training data.
    """
    rows = []
    for chunk in prompts.split(batch_size):
        out = model(input_ids=chunk, use_cache=True)
        tokens = [out.logits[:, -1].argmax(-1)]
        for _ in range(new_tokens - 1):
            out = model(input_ids=tokens[-1].unsqueeze(1), cache=out.cache, use_cache=True)
            tokens.append(out.logits[:, -1].argmax(-1))
        rows.append(torch.cat([chunk, torch.stack(tokens, dim=1)], dim=1))
    return torch.cat(rows)


@torch.no_grad()
def teacher_topk(model: PreTrainedModel, windows: torch.Tensor, k: int,
                 batch_size: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """The teacher's k most likely next tokens at every input position of ``windows[:, :-1]``.

    Returns ids (int32) and their probabilities renormalised over the k (float16), the compact
    soft labels that distillation trains on; 4096-wide rows would not fit in memory.
    """
    all_ids, all_probs = [], []
    for chunk in windows[:, :-1].split(batch_size):
        logits = model(input_ids=chunk).logits.float()
        top, ids = logits.topk(k, dim=-1)
        all_ids.append(ids.to(torch.int32))
        all_probs.append(F.softmax(top, dim=-1).to(torch.float16))
    return torch.cat(all_ids), torch.cat(all_probs)
