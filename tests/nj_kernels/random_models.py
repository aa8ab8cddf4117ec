"""Random Llama-family models of chosen dimensions for the CPU kernel tests (imported as a
plain module): every variant the fused decode path takes, in fp32 or with its matrices as GGUF
blocks, and a state dict back from a runner."""

from __future__ import annotations

from typing import Any

import gguf
import numpy as np
import torch

from nj_kernels.quant_linear import QuantWeight
from worker.engine.model_config import ModelConfig
from worker.engine.model_runner import ModelRunner

BS = 4
VOCAB = 50
VARIANTS: dict[str, dict[str, Any]] = {
    "llama_gqa": dict(hidden=64, heads=4, kv_heads=2, head_dim=16, inter=96),
    "odd_widths": dict(hidden=72, heads=3, kv_heads=1, head_dim=24, inter=100),  # vector tails everywhere
    "qwen2_biases": dict(hidden=64, heads=4, kv_heads=2, head_dim=16, inter=96, bias=True),
    "qwen3_qk_norm": dict(hidden=64, heads=8, kv_heads=2, head_dim=16, inter=96, qk_norm=True),
    "mha_128": dict(hidden=256, heads=2, kv_heads=2, head_dim=128, inter=128),
    "head_64": dict(hidden=128, heads=2, kv_heads=1, head_dim=64, inter=64),
    "gqa5_64": dict(hidden=320, heads=5, kv_heads=1, head_dim=64, inter=64),  # heads attended 4 + 1
    "gqa_128": dict(hidden=256, heads=4, kv_heads=2, head_dim=128, inter=64),  # 2 heads a pass
}


def make_runner(hidden: int, heads: int, kv_heads: int, head_dim: int, inter: int,
                bias: bool = False, qk_norm: bool = False, layers: int = 2,
                qtype: int | None = None) -> ModelRunner:  # fmt: skip
    """A random model of these dimensions, weights scaled so activations stay near 1; with a
    GGML ``qtype`` (e.g. 3: Q4_1), its matrices (the tied embedding too, as a file holds it)
    quantised to GGUF blocks of that type by ``gguf.quants`` (widths: whole blocks of 32)."""
    config = ModelConfig(
        model_type="qwen3" if qk_norm else "qwen2" if bias else "llama", vocab_size=VOCAB, hidden_size=hidden,
        intermediate_size=inter, num_layers=layers, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
        rms_norm_eps=1e-6, max_position_embeddings=512, tie_word_embeddings=True,
        rope={"rope_type": "default", "rope_theta": 10000.0, "head_dim": head_dim}, qk_norm=qk_norm,
    )  # fmt: skip
    g = torch.Generator().manual_seed(hidden * 7 + heads)

    def mat(n: int, k: int) -> torch.Tensor:
        return torch.randn(n, k, generator=g) * (1.5 / k**0.5)

    def norm(n: int) -> torch.Tensor:
        return 1 + 0.2 * torch.randn(n, generator=g)

    state: dict[str, torch.Tensor | QuantWeight] = {
        "model.embed_tokens.weight": torch.randn(VOCAB, hidden, generator=g),
        "model.norm.weight": norm(hidden),
    }
    for i in range(layers):
        p = f"model.layers.{i}."
        state |= {
            p + "input_layernorm.weight": norm(hidden),
            p + "post_attention_layernorm.weight": norm(hidden),
            p + "self_attn.q_proj.weight": mat(heads * head_dim, hidden),
            p + "self_attn.k_proj.weight": mat(kv_heads * head_dim, hidden),
            p + "self_attn.v_proj.weight": mat(kv_heads * head_dim, hidden),
            p + "self_attn.o_proj.weight": mat(hidden, heads * head_dim),
            p + "mlp.gate_proj.weight": mat(inter, hidden),
            p + "mlp.up_proj.weight": mat(inter, hidden),
            p + "mlp.down_proj.weight": mat(hidden, inter),
        }
        if bias:
            for x, n in (("q", heads), ("k", kv_heads), ("v", kv_heads)):
                state[p + f"self_attn.{x}_proj.bias"] = 0.3 * torch.randn(n * head_dim, generator=g)
        if qk_norm:
            state[p + "self_attn.q_norm.weight"] = norm(head_dim)
            state[p + "self_attn.k_norm.weight"] = norm(head_dim)
    if qtype is not None:
        for name, w in list(state.items()):
            if isinstance(w, torch.Tensor) and w.dim() == 2:  # the (tied) embedding too, as a file holds it
                raw = gguf.quants.quantize(w.numpy(), gguf.GGMLQuantizationType(qtype))
                state[name] = QuantWeight.from_numpy(qtype, (w.shape[0], w.shape[1]), np.asarray(raw))
    return ModelRunner(config, state, BS, torch.device("cpu"), torch.float32, num_blocks=48)


def state_of(runner: ModelRunner) -> dict[str, torch.Tensor]:
    """A checkpoint-shaped state dict back from a runner's (fused) tensors."""
    m, cfg = runner.model, runner.config
    h, kvh, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    state = {"model.embed_tokens.weight": m.embed, "model.norm.weight": m.norm}
    for i, layer in enumerate(m.layers):
        p = f"model.layers.{i}."
        q, k, v = layer.qkv.split([h * d, kvh * d, kvh * d])
        gate, up = layer.gate_up.chunk(2)
        named = {
            "input_layernorm": layer.input_norm, "post_attention_layernorm": layer.post_norm,
            "self_attn.q_proj": q, "self_attn.k_proj": k, "self_attn.v_proj": v, "self_attn.o_proj": layer.o,
            "mlp.gate_proj": gate, "mlp.up_proj": up, "mlp.down_proj": layer.down,
        }  # fmt: skip
        state |= {f"{p}{name}.weight": t for name, t in named.items()}
    return state
