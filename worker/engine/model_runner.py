"""A model plus its paged KV cache, run on a list of ``ForwardItem``.

The same class serves the target and each model drafter (a smaller model with its own
cache and its own BlockManager): it knows nothing of requests or scheduling. An item is
"compute these tokens at these positions through this block table, and give me the logits
of the last ``num_logits`` rows": 1 for the end of a prefill chunk or a decode row, γ+1 for
a speculative verification, 0 for a chunk in the middle of a prompt.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from nj_kernels import cpu_attention
from nj_kernels.cpu_linear import embedding
from nj_kernels.quant_linear import QuantWeight, Weight
from worker.engine.attention import AttentionGroup, plan_group
from worker.engine.config import DEFAULT_KV_BYTES
from worker.engine.kv_cache import KVCache, blocks_for_budget
from worker.engine.model import DecoderModel
from worker.engine.model_config import ModelConfig

# A group's keys are gathered and attended up to its longest context: split a group when a
# context exceeds the group's shortest by this factor (plus slack, so short ones stay
# together), which bounds the padding at the price of one more attention call per layer.
GROUP_SPREAD = 1.5
GROUP_SLACK = 64


@dataclass
class ForwardItem:
    token_ids: list[int]  # the new tokens (already in the sequence) to compute
    start: int  # position of the first one (= tokens already cached)
    block_table: list[int]  # must cover positions < start + len(token_ids)
    num_logits: int = 1


class ModelRunner:
    row_invariant = False  # attention planned row by row (nj_kernels.cpu_attention)

    def __init__(
        self,
        config: ModelConfig,
        state: Mapping[str, Weight],
        block_size: int,
        device: torch.device,
        dtype: torch.dtype,
        num_blocks: int | None = None,
        memory_budget_bytes: int | None = None,
        default_kv_bytes: int = DEFAULT_KV_BYTES,
    ) -> None:
        self.config, self.block_size = config, block_size
        self.device, self.dtype = device, dtype
        self.model = DecoderModel(config, state, device, dtype)
        if device.type == "cpu":
            self.model.pack_weights()
        self.weight_bytes = self.model.weight_bytes()
        # GGUF blocks on CPU: attention row by row too, so a position's logits never depend
        # on the rows computed with it (the block kernel's products already do not).
        self.row_invariant = (
            device.type == "cpu"
            and any(isinstance(w, QuantWeight) for w in state.values())
            and cpu_attention.supports(config.num_heads, config.num_kv_heads, config.head_dim)
        )
        if num_blocks is None:
            budget = memory_budget_bytes or self.weight_bytes + default_kv_bytes
            num_blocks = blocks_for_budget(config, block_size, dtype, budget, self.weight_bytes)
        self.cache = KVCache(config, num_blocks, block_size, device, dtype)
        self.group_size = config.num_heads // config.num_kv_heads

    def run(self, items: list[ForwardItem]) -> tuple[torch.Tensor, list[int]]:
        """One forward over all items. Returns ``logits [R, V]`` and, per item, the index of
        its first logits row (its rows are consecutive, in position order)."""
        batch = self._batch(items)
        return self.model.forward(*batch.inputs, batch.logits_rows), batch.first_logit

    @torch.inference_mode()
    def run_with_features(
        self, items: list[ForwardItem]
    ) -> tuple[torch.Tensor, list[int], list[torch.Tensor]]:
        """``run``, plus each item's post-norm last-layer hidden states (one row per token,
        in position order): what a feature drafter reads."""
        batch = self._batch(items)
        model = self.model
        hidden = model.run_layers(embedding(batch.inputs[0], model.embed), *batch.inputs[1:])
        feats = model.features(hidden)
        rows = [feats[r : r + len(item.token_ids)] for item, r in zip(items, batch.row_of, strict=True)]
        return model.logits(hidden, batch.logits_rows), batch.first_logit, rows

    def _batch(self, items: list[ForwardItem]) -> _Batch:
        bs = self.block_size
        # Rows are laid out grouped by query length, then context length, so each attention
        # group is contiguous in the batch.
        order = sorted(range(len(items)), key=lambda i: (len(items[i].token_ids), items[i].start))
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        row_of = [0] * len(items)
        groups = []
        pending: list[int] = []  # items of the group being collected

        def close_group() -> None:
            if pending:
                nq = len(items[pending[0]].token_ids)
                groups.append(
                    plan_group(
                        row_of[pending[0]],
                        nq,
                        [items[i].block_table for i in pending],
                        [items[i].start + nq for i in pending],
                        bs,
                        self.group_size,
                        self.device,
                        self.dtype,
                        self.row_invariant,
                    )
                )
                pending.clear()

        for i in order:
            item = items[i]
            n = len(item.token_ids)
            if n == 0:
                raise ValueError("a forward item needs at least one token")
            if pending and (
                len(items[pending[0]].token_ids) != n
                or item.start + n > GROUP_SPREAD * (items[pending[0]].start + n) + GROUP_SLACK
            ):
                close_group()
            row_of[i] = len(input_ids)
            pending.append(i)
            input_ids += item.token_ids
            pos = range(item.start, item.start + n)
            positions += pos
            table = item.block_table
            slots += [table[p // bs] * bs + p % bs for p in pos]
        close_group()

        logits_rows: list[int] = []
        first_logit: list[int] = []
        for i, item in enumerate(items):
            first_logit.append(len(logits_rows))
            end = row_of[i] + len(item.token_ids)
            logits_rows += range(end - item.num_logits, end)
        dev = self.device
        inputs = (
            torch.tensor(input_ids, dtype=torch.long, device=dev),
            torch.tensor(positions, dtype=torch.long, device=dev),
            torch.tensor(slots, dtype=torch.long, device=dev),
            self.cache.kv,
            groups,
        )
        return _Batch(inputs, torch.tensor(logits_rows, dtype=torch.long, device=dev), first_logit, row_of)


@dataclass
class _Batch:
    """One forward's laid-out inputs (ids, positions, slots, kv, groups) and its row maps."""

    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, list[AttentionGroup]]
    logits_rows: torch.Tensor
    first_logit: list[int]  # per item: its first logits row
    row_of: list[int]  # per item: its first input row
