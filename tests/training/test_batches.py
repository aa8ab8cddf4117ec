import pytest
import torch
from transformers import PreTrainedTokenizerFast

from training.batches import RowSampler, WindowSampler, chunk_windows, encode_documents


def test_documents_follow_an_eot(tiny_tokenizer: PreTrainedTokenizerFast) -> None:
    stream = encode_documents(tiny_tokenizer, ["a cat", "the dog"], 0)
    assert stream[0].item() == 0
    assert (stream == 0).sum().item() == 2
    assert tiny_tokenizer.decode(stream.tolist()) == "<|endoftext|>a cat<|endoftext|>the dog"


def test_chunks_overlap_by_one_token() -> None:
    w = chunk_windows(torch.arange(10), 3)
    assert w.tolist() == [[0, 1, 2, 3], [3, 4, 5, 6], [6, 7, 8, 9]]
    with pytest.raises(ValueError):
        chunk_windows(torch.arange(3), 3)


def test_samplers_are_deterministic_per_seed() -> None:
    stream = torch.arange(1000)
    a = WindowSampler(stream, 16, seed=3).sample(4)
    b = WindowSampler(stream, 16, seed=3).sample(4)
    assert torch.equal(a, b) and a.shape == (4, 17)
    assert torch.equal(a[:, 1:] - a[:, :-1], torch.ones(4, 16, dtype=torch.long))  # contiguous windows
    assert not torch.equal(a, WindowSampler(stream, 16, seed=4).sample(4))
    assert torch.equal(RowSampler(50, 1).sample(8), RowSampler(50, 1).sample(8))
