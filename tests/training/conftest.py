"""Fixtures for the training tests: a tiny corpus, a tokenizer trained on it, tiny recipes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import PreTrainedTokenizerFast

from training.specs import ArchSpec, Recipe
from training.tokenizer import train_tokenizer

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"  # the read-only team data

TINY_TEXT = [
    "Once upon a time there was a little cat. The cat liked to play in the sun.",
    "One day the cat saw a big dog. The dog was kind and they became friends.",
    "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n",
    "ROMEO: But soft, what light through yonder window breaks?\nIt is the east.",
]


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    # The tests share two cores with other people's work; one thread is faster then.
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_tokenizer() -> PreTrainedTokenizerFast:
    return train_tokenizer(TINY_TEXT * 8, vocab_size=320)


@pytest.fixture()
def tiny_target() -> Recipe:
    return Recipe(name="nj-target", arch=ArchSpec(hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64),
                  domains=("stories", "code"), steps=40, batch_size=8, seq_len=32, lr=1e-2, warmup=5)


@pytest.fixture()
def tiny_drafter() -> Recipe:
    arch = ArchSpec(hidden=16, layers=1, heads=2, kv_heads=1, intermediate=32)
    return Recipe(name="nj-draft-prose", arch=arch, domains=("stories",), steps=30, batch_size=8, seq_len=32,
                  lr=1e-2, warmup=5, distill=True, topk=8, continuations=4, max_windows=8)
