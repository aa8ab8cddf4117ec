"""Next-token logits of recently computed prompts, for exact repeats (RAKV-ASD).

Keyed by the full tuple of token ids, so a hit is validated on every token id (the dict
compares keys for equality after hashing). Least recently used entries go first. Only
useful together with the prefix cache holding the prompt's KV, which the engine checks.
"""

from __future__ import annotations

from collections import OrderedDict

import torch


class LogitsCache:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[tuple[int, ...], torch.Tensor] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, token_ids: list[int]) -> torch.Tensor | None:
        key = tuple(token_ids)
        logits = self._entries.get(key)
        if logits is not None:
            self._entries.move_to_end(key)
        return logits

    def put(self, token_ids: list[int], logits: torch.Tensor) -> None:
        if self.capacity <= 0:
            return
        key = tuple(token_ids)
        # A private copy: the caller's row is a view into the whole step's logits.
        self._entries[key] = logits.detach().clone()
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
