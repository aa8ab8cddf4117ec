"""Tiny random Llama-family checkpoints (a few layers, hidden 64) for the engine tests.

Weights use a large init range so greedy outputs vary instead of repeating one token, and
near-ties between the top two logits (which rounding could flip) are rare.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    MistralConfig,
    PretrainedConfig,
    Qwen2Config,
    Qwen3Config,
)

VOCAB = 96
COMMON: dict[str, Any] = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
    initializer_range=0.3,
    bos_token_id=1,
    eos_token_id=2,
)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}


def tiny_configs() -> dict[str, PretrainedConfig]:
    return {
        "llama": LlamaConfig(**COMMON),
        "llama3_tied": LlamaConfig(**COMMON, rope_parameters=LLAMA3_ROPE, tie_word_embeddings=True),
        "mistral": MistralConfig(**COMMON, sliding_window=512),
        "qwen2": Qwen2Config(**COMMON, tie_word_embeddings=False),
        "qwen3": Qwen3Config(**{**COMMON, "num_attention_heads": 8}, head_dim=16, tie_word_embeddings=False),
    }


ARCHS = list(tiny_configs())


def save_tiny(config: PretrainedConfig, path: Path, seed: int = 0) -> Path:
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval()
    if getattr(config, "attention_bias", False) or config.model_type == "qwen2":
        # Random biases: the default init leaves them at zero, which would hide a missing bias.
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("bias"):
                    p.normal_(0, 0.3)
    model.save_pretrained(path)
    return path


def hf_model(path: Path) -> Any:
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def hf_greedy(model: Any, prompt: list[int], max_new_tokens: int, stop_at_eos: bool) -> list[int]:
    """transformers' own greedy ``generate``: the exactness oracle. With ``stop_at_eos``
    false it runs to ``max_new_tokens`` (the checkpoint's generation config would stop it)."""
    model.generation_config.eos_token_id = model.config.eos_token_id if stop_at_eos else None
    model.generation_config.pad_token_id = 0
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            do_sample=False,
        )
    return [int(t) for t in out[0, len(prompt) :]]
