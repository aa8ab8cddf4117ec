"""Checkpoint formats: single and sharded safetensors, bf16 upcast, GGUF."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.worker.engine.gguf_file import write_gguf
from tests.worker.engine.tiny import VOCAB, hf_model
from worker.engine.model_runner import ForwardItem, ModelRunner
from worker.engine.weights import find_gguf, load_checkpoint

IDS = torch.randint(3, VOCAB, (1, 23), generator=torch.Generator().manual_seed(3))


def our_logits(path: Path) -> torch.Tensor:
    config, state = load_checkpoint(path)
    runner = ModelRunner(config, state, 8, torch.device("cpu"), torch.float32, num_blocks=8)
    logits, _ = runner.run([ForwardItem(IDS[0].tolist(), 0, [0, 1, 2], IDS.shape[1])])
    return logits


def hf_logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.inference_mode():
        return model(IDS).logits[0]


def test_sharded_safetensors(llama_dir: Path, tmp_path: Path) -> None:
    hf_model(llama_dir).save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    assert torch.equal(our_logits(tmp_path), our_logits(llama_dir))


def test_bf16_checkpoint_is_upcast_on_cpu(llama_dir: Path, tmp_path: Path) -> None:
    hf_model(llama_dir).to(torch.bfloat16).save_pretrained(tmp_path)
    ref = hf_logits(AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32))
    ours = our_logits(tmp_path)
    assert float((ours - ref).abs().max() / ref.abs().max()) <= 1e-4


def test_gguf_through_transformers_loader(llama_dir: Path, tmp_path: Path) -> None:
    original = hf_model(llama_dir)
    write_gguf(original, tmp_path / "tiny.gguf")
    assert find_gguf(tmp_path) == "tiny.gguf"
    ref = hf_logits(original)
    ours = our_logits(tmp_path)
    assert float((ours - ref).abs().max() / ref.abs().max()) <= 1e-4


def test_ambiguous_or_missing_checkpoints(tmp_path: Path) -> None:
    (tmp_path / "a.gguf").write_bytes(b"")
    (tmp_path / "b.gguf").write_bytes(b"")
    with pytest.raises(ValueError, match="several GGUF"):
        find_gguf(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(FileNotFoundError):
        load_checkpoint(empty)
