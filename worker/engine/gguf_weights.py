"""A GGUF checkpoint read as it is stored: every weight matrix stays in its encoding.

``load_gguf_native(path)`` returns the model's ``ModelConfig`` (from the file's metadata,
``gguf_file.GGUFFile.hf_config``) and a state dict with Hugging Face names in which each
2-D matrix is a ``nj_kernels.quant_linear.QuantWeight`` (its blocks, copied out of the
memory-mapped file) and each vector (norms, biases) an fp32 tensor. Nothing is dequantised
but those vectors: the model multiplies the blocks directly (``QuantWeight.linear``) and looks
embeddings up row by row (``QuantWeight.embedding``).

llama.cpp's converter interleaves the rows of each query and key head for its rotary layout
(architecture ``llama`` only); the rows are put back in transformers' order here, which moves
whole rows of blocks and changes no value (transformers' own GGUF loader does the same on the
dequantised matrices, so both paths compute with the same weights).

A matrix type the kernel does not read (Q5_0, Q5_K, the IQ types, ...) is dequantised by the
gguf package and served as F32, with a warning naming it. A file whose matrices are all F32
(nothing to dequantise) is served as plain fp32 tensors, so it takes the fused fp32 decode path
like a safetensors checkpoint (exact as that path is: row-invariant up to its row limit).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

from nj_kernels.quant_linear import TYPE_IDS, TYPES, QuantWeight, Weight
from worker.engine.gguf_file import GGUFFile
from worker.engine.model_config import ModelConfig

log = logging.getLogger(__name__)

_TOP = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_IGNORED = {"rope_freqs.weight"}  # llama3 rotary factors: computed from the config instead
_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)$")


def hf_name(name: str) -> str | None:
    """The Hugging Face name of a GGUF tensor (None: a tensor the model does not read)."""
    if name in _TOP:
        return _TOP[name]
    if name in _IGNORED:
        return None
    m = _BLOCK.match(name)
    if m is None or m.group(2) not in _LAYER:
        raise ValueError(f"GGUF tensor {name!r} is not one of a Llama-family decoder's")
    return f"model.layers.{m.group(1)}.{_LAYER[m.group(2)]}.{m.group(3)}"


def unpermute_rows(rows: int, heads: int) -> torch.Tensor:
    """The row order that undoes llama.cpp's q/k permutation: HF row ``i`` is GGUF row
    ``index[i]`` (per head, GGUF interleaves the two rotary halves)."""
    half = rows // heads // 2
    return torch.arange(rows).view(heads, half, 2).transpose(1, 2).reshape(-1)


def load_gguf_native(path: Path) -> tuple[ModelConfig, dict[str, Weight]]:
    import gguf

    file = GGUFFile(path)
    config = ModelConfig.from_dict(file.hf_config())
    permuted = file.architecture() == "llama"
    heads = {"q_proj": config.num_heads, "k_proj": config.num_kv_heads}
    state: dict[str, Weight] = {}
    converted: set[str] = set()
    for t in file.tensors.values():
        name = hf_name(t.name)
        if name is None:
            continue
        raw = file.raw(t.name)
        if len(t.shape) == 1:
            values = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(t.type)).reshape(t.shape)
            state[name] = torch.from_numpy(np.array(values, dtype=np.float32))
            continue
        if len(t.shape) != 2:
            raise ValueError(f"GGUF tensor {t.name} has shape {t.shape}: not a decoder's vector or matrix")
        qtype = t.type
        if qtype not in TYPES:
            kind = gguf.GGMLQuantizationType(qtype)
            converted.add(kind.name)
            raw = np.ascontiguousarray(gguf.quants.dequantize(raw, kind), dtype=np.float32)
            qtype = TYPE_IDS["F32"]
        w = QuantWeight.from_numpy(qtype, (t.shape[0], t.shape[1]), raw)
        proj = name.split(".")[-2]
        if permuted and proj in heads:
            w = w.select_rows(unpermute_rows(t.shape[0], heads[proj]))
        state[name] = w
    if converted:
        log.warning("%s: %s matrices are served as F32 (the block kernel reads %s)",
                    path.name, ", ".join(sorted(converted)), QuantWeight.type_names())  # fmt: skip
    matrices = [w for w in state.values() if isinstance(w, QuantWeight)]
    if matrices and all(w.type_name == "F32" for w in matrices):
        # An all-F32 file holds plain fp32 matrices: served as tensors (the same bytes), they
        # take the fused fp32 decode path (nj_kernels/cpu_decode.py), 1.35x faster at batch 1.
        state = {k: as_tensor(w) if isinstance(w, QuantWeight) else w for k, w in state.items()}
    return config, state


def as_tensor(w: QuantWeight) -> torch.Tensor:
    """An F32 matrix's bytes as the fp32 tensor they are."""
    return w.data.view(torch.float32).view(w.shape)


def describe(state: Mapping[str, Weight]) -> str:
    """The matrices' encodings by share of weights, e.g. ``Q4_1`` or ``Q4_1+Q8_0``."""
    counts: dict[str, int] = {}
    for w in state.values():
        if isinstance(w, QuantWeight):
            counts[w.type_name] = counts.get(w.type_name, 0) + w.shape[0] * w.shape[1]
    return "+".join(sorted(counts, key=lambda n: -counts[n]))
