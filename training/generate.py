"""Teacher outputs used for distillation and evaluation: greedy continuations and top-k labels."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from shared.progress import Progress


@torch.no_grad()
def greedy_continue(model: PreTrainedModel, prompts: torch.Tensor, new_tokens: int,
                    batch_size: int = 64) -> torch.Tensor:
    """Appends ``new_tokens`` greedy tokens to each (equal-length) prompt row.

    Unlike ``generate`` it does not stop at eos: a model that ends a document goes on to
    start the next one, which is still its own greedy text and useful training data.
    """
    rows = []
    progress = Progress("  teacher continuations", prompts.shape[0], "prompts")
    for chunk in prompts.split(batch_size):
        out = model(input_ids=chunk, use_cache=True)
        tokens = [out.logits[:, -1].argmax(-1)]
        for _ in range(new_tokens - 1):
            out = model(input_ids=tokens[-1].unsqueeze(1), cache=out.cache, use_cache=True)
            tokens.append(out.logits[:, -1].argmax(-1))
        rows.append(torch.cat([chunk, torch.stack(tokens, dim=1)], dim=1))
        progress.update(progress.done + chunk.shape[0])
    return torch.cat(rows)


@torch.no_grad()
def teacher_topk(model: PreTrainedModel, windows: torch.Tensor, k: int,
                 batch_size: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """The teacher's k most likely next tokens at every input position of ``windows[:, :-1]``.

    Returns ids (int32) and their probabilities renormalised over the k (float16), the compact
    soft labels that distillation trains on; 4096-wide rows would not fit in memory.
    """
    all_ids, all_probs = [], []
    progress = Progress("  teacher labels", windows.shape[0], "windows")
    for chunk in windows[:, :-1].split(batch_size):
        logits = model(input_ids=chunk).logits.float()
        top, ids = logits.topk(k, dim=-1)
        all_ids.append(ids.to(torch.int32))
        all_probs.append(F.softmax(top, dim=-1).to(torch.float16))
        progress.update(progress.done + chunk.shape[0])
    return torch.cat(all_ids), torch.cat(all_probs)


@dataclass
class LabelledSeq:
    """A prompt, the teacher's greedy continuation, and its top-k next-token labels.

    ``topk_ids[i]``/``topk_probs[i]`` describe the teacher's distribution for ``tokens[i + 1]``,
    so there are ``len(tokens) - 1`` rows; probabilities are renormalised over the k.
    """

    tokens: list[int]
    prompt_len: int
    topk_ids: torch.Tensor  # [len(tokens) - 1, k] int32
    topk_probs: torch.Tensor  # [len(tokens) - 1, k] float16

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.prompt_len:]


def left_padded(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A batch of prompts padded on the left: token ids, attention mask, and positions that
    start at 0 on each prompt's first real token."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask, (mask.cumsum(-1) - 1).clamp_min(0)


def _topk(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    top, ids = logits.float().topk(k, dim=-1)
    return ids.to(torch.int32), F.softmax(top, dim=-1).to(torch.float16)


@torch.no_grad()
def generate_labelled(model: PreTrainedModel, prompts: list[list[int]], new_tokens: int, k: int,
                      eos_id: int | None, pad_id: int, batch_size: int = 16) -> list[LabelledSeq]:
    """Greedy continuations of prompts of any length, keeping every position's top-k labels.

    Prompts are left-padded (masked, with positions counted from each prompt's first token) and
    batched by length. A row stops after it emits ``eos_id``. The prefill's logits label the
    prompt itself, so one teacher pass yields labels for the prompt and the continuation.
    """
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    results: dict[int, LabelledSeq] = {}
    progress = Progress("  teacher continuations with labels", len(prompts), "prompts")
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        progress.update(start)
        ids, mask, pos = left_padded([prompts[i] for i in rows], pad_id)
        width = ids.shape[1]
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
        ids_k, probs_k = _topk(out.logits, k)
        steps_ids, steps_probs, emitted = [], [], []
        nxt = out.logits[:, -1].argmax(-1)
        done = torch.zeros(len(rows), dtype=torch.bool)
        for step in range(new_tokens):
            emitted.append(nxt)
            if eos_id is not None:
                done |= nxt == eos_id
            if bool(done.all()) or step == new_tokens - 1:
                break
            mask = torch.cat([mask, torch.ones(len(rows), 1, dtype=mask.dtype)], dim=1)
            pos = pos[:, -1:] + 1
            out = model(input_ids=nxt.unsqueeze(1), attention_mask=mask, position_ids=pos, cache=out.cache,
                        use_cache=True)
            i_k, p_k = _topk(out.logits[:, -1], k)
            steps_ids.append(i_k)
            steps_probs.append(p_k)
            nxt = out.logits[:, -1].argmax(-1)
        gen = torch.stack(emitted, dim=1).tolist()
        for r, i in enumerate(rows):
            n = len(prompts[i])
            cont = gen[r]
            if eos_id is not None and eos_id in cont:
                cont = cont[:cont.index(eos_id) + 1]
            labels_ids = [ids_k[r, width - n:]] + [s[r:r + 1] for s in steps_ids[:len(cont) - 1]]
            labels_probs = [probs_k[r, width - n:]] + [s[r:r + 1] for s in steps_probs[:len(cont) - 1]]
            results[i] = LabelledSeq(prompts[i] + cont, n, torch.cat(labels_ids), torch.cat(labels_probs))
    return [results[i] for i in range(len(prompts))]
