"""Write a tiny Llama as a GGUF file (llama.cpp names and q/k layout), its matrices in any type
the block kernel reads: F32, F16, BF16, Q8_0, Q4_0 and Q4_1 quantised by ``gguf.quants``;
Q4_K and Q6_K (which ``gguf.quants`` cannot quantise) built block by block from random
quants under sane scales, so the model those blocks encode is what the file holds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as Q

_LAYER_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}
QUANTISABLE = (Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1)


def _llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    # llama.cpp stores q/k rows interleaved for its rotary layout; transformers undoes this.
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def random_kquant_blocks(qtype: Q, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """``[rows, bytes]`` of Q4_K or Q6_K blocks: random quants and scales, f16 super-scales
    small enough that the weights stay in (-1, 1)."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    f16 = lambda v: np.frombuffer(np.float16(v).tobytes(), np.uint8)  # noqa: E731
    if qtype == Q.Q4_K:  # d, dmin, scales[12], qs[128]
        raw[..., 0:2] = f16(0.0007)
        raw[..., 2:4] = f16(0.004)
    elif qtype == Q.Q6_K:  # ql[128], qh[64], scales[16], d
        raw[..., 208:210] = f16(0.0002)
    else:
        raise ValueError(f"{qtype.name} is not a K-quant")
    return raw.reshape(rows, -1)


def write_gguf(
    model: Any, path: Path, qtype: Q = Q.F32, types: dict[str, Q] | None = None, seed: int = 0
) -> Path:
    """The model's weights as ``path``: matrices in ``qtype`` (``types`` overrides it per GGUF
    tensor name), vectors in F32. K-quant matrices are random blocks of the model's shapes."""
    cfg = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-llama")
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_eos_token_id(int(cfg.eos_token_id))
    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    for i in range(cfg.num_hidden_layers):
        for ours, theirs in _LAYER_NAMES.items():
            names[f"model.layers.{i}.{ours}.weight"] = f"blk.{i}.{theirs}.weight"
    rng = np.random.default_rng(seed)
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        w = tensor.detach().to(torch.float32).numpy()
        if "q_proj" in name:
            w = _llama_cpp_permute(w, cfg.num_attention_heads)
        elif "k_proj" in name:
            w = _llama_cpp_permute(w, cfg.num_key_value_heads)
        kind = (types or {}).get(names[name], qtype) if w.ndim == 2 else Q.F32
        if kind in (Q.Q4_K, Q.Q6_K):
            writer.add_tensor(names[name], random_kquant_blocks(kind, *w.shape, rng), raw_dtype=kind)
        elif kind in QUANTISABLE and kind not in (Q.F32, Q.F16):
            blocks = gguf.quants.quantize(np.ascontiguousarray(w), kind)
            writer.add_tensor(names[name], blocks, raw_dtype=kind)
        elif kind == Q.F16:
            writer.add_tensor(names[name], np.ascontiguousarray(w.astype(np.float16)))
        else:
            writer.add_tensor(names[name], np.ascontiguousarray(w))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
