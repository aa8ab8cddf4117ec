"""Token streams and the deterministic windows cut from them."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedTokenizerBase

from training.corpus import Domain
from training.tokenizer import eot_id


def encode_documents(tokenizer: PreTrainedTokenizerBase, docs: Sequence[str], eot_id: int) -> torch.Tensor:
    """One stream ``<eot> doc <eot> doc ...``: every document starts right after an eot.

    That is also how a prompt looks to the model after a previous conversation turn, and it
    teaches the model to open a fresh document after eot.
    """
    encoded = tokenizer(list(docs), add_special_tokens=False, verbose=False)["input_ids"]
    out: list[int] = []
    for ids in encoded:
        out.append(eot_id)
        out.extend(ids)
    return torch.tensor(out, dtype=torch.long)


def encode_domains(tokenizer: PreTrainedTokenizerBase, domains: dict[str, Domain],
                   split: str) -> dict[str, torch.Tensor]:
    """Each domain's ``train`` or ``val`` documents as one stream."""
    eot = eot_id(tokenizer)
    return {name: encode_documents(tokenizer, getattr(d, split), eot) for name, d in domains.items()}


def chunk_windows(stream: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Non-overlapping windows of ``seq_len + 1`` tokens (inputs plus the shifted targets)."""
    n = (stream.numel() - 1) // seq_len
    if n == 0:
        raise ValueError(f"a stream of {stream.numel()} tokens holds no window of {seq_len + 1}")
    idx = torch.arange(n).unsqueeze(1) * seq_len + torch.arange(seq_len + 1).unsqueeze(0)
    return stream[idx]


class WindowSampler:
    """Windows of ``seq_len + 1`` tokens at uniformly random offsets of a stream.

    A seeded generator fixes the data order, so the same seed gives the same batches.
    Sampling by offset weighs each domain of a concatenated stream by its token count.
    """

    def __init__(self, stream: torch.Tensor, seq_len: int, seed: int) -> None:
        if stream.numel() <= seq_len + 1:
            raise ValueError(f"a stream of {stream.numel()} tokens is too short for windows of {seq_len + 1}")
        self.stream = stream
        self.seq_len = seq_len
        self.generator = torch.Generator().manual_seed(seed)

    def sample(self, batch_size: int) -> torch.Tensor:
        high = self.stream.numel() - self.seq_len - 1
        starts = torch.randint(0, high + 1, (batch_size,), generator=self.generator)
        idx = starts.unsqueeze(1) + torch.arange(self.seq_len + 1).unsqueeze(0)
        return self.stream[idx]


class RowSampler:
    """Random rows (with replacement) of a fixed set of windows, uniformly or by weight."""

    def __init__(self, num_rows: int, seed: int, weights: torch.Tensor | None = None) -> None:
        self.num_rows = num_rows
        self.weights = weights
        self.generator = torch.Generator().manual_seed(seed)

    def sample(self, batch_size: int) -> torch.Tensor:
        if self.weights is None:
            return torch.randint(0, self.num_rows, (batch_size,), generator=self.generator)
        return torch.multinomial(self.weights, batch_size, replacement=True, generator=self.generator)
