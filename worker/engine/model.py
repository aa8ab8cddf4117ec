"""A Llama-family decoder (Llama, Mistral, Qwen2, Qwen3) over a flattened, paged batch.

Every linear layer runs once over all rows of the step (q/k/v and gate/up are fused into one
matrix each); attention runs per ``AttentionGroup``. The arithmetic mirrors transformers
(RMSNorm in fp32, rotary in the model dtype, SiLU MLP) so fp32 logits agree to rounding.

Two paths run the layers: op by op in torch (any device, dtype and row count), and, for few
fp32 CPU rows (decode rows, verifications), all layers in one C call
(``nj_kernels/cpu_decode.py``), which computes the same thing without torch's per-op cost; a
model whose matrices are all GGUF blocks runs every forward there, whatever its row count (its
row invariance then holds across all forwards, see ``cpu_decode``).

A weight matrix is a tensor, or (a GGUF checkpoint served as it is stored, ``gguf_weights``)
a ``QuantWeight`` that computes its own product and embedding rows: ``linear`` and
``embedding`` of ``nj_kernels.cpu_linear`` take either, so the op-by-op path does not tell them
apart; the fused C path reads both (a ``StackedWeight`` of mixed types runs op by op).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from nj_kernels import cpu_decode, weight_arena
from nj_kernels.cpu_linear import embedding, linear, max_rows
from nj_kernels.kv_ops import write_kv
from nj_kernels.quant_linear import QuantWeight, Weight, stack
from worker.engine.attention import AttentionGroup, group_attention
from worker.engine.model_config import ModelConfig
from worker.engine.rope import Rotary

MIN_GEMM_ROWS = 4


@dataclass
class LayerWeights:
    input_norm: torch.Tensor
    qkv: Weight
    qkv_bias: torch.Tensor | None
    qk_norm: torch.Tensor | None  # [H + KVH, D]: q_norm for query heads, k_norm for KV heads
    o: Weight
    o_bias: torch.Tensor | None
    post_norm: torch.Tensor
    gate_up: Weight
    gate_up_bias: torch.Tensor | None
    down: Weight
    down_bias: torch.Tensor | None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    if dtype == torch.float32:
        # One fused op; in fp32 it rounds like transformers' multi-op form below. A 2-D
        # weight (per-head q/k norms stacked) is applied after normalising the last dim.
        if weight.dim() == 1:
            return F.rms_norm(x, weight.shape, weight, eps)
        return F.rms_norm(x, (x.shape[-1],), None, eps) * weight
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(dtype)


class DecoderModel:
    """Weights plus the forward pass; holds no cache and no per-request state."""

    def __init__(
        self, config: ModelConfig, state: Mapping[str, Weight], device: torch.device, dtype: torch.dtype
    ) -> None:
        self.config = config
        self.device, self.dtype = device, dtype
        self.scale = config.head_dim**-0.5
        self.rotary = Rotary(config.rope, device, dtype)

        def mat(name: str) -> Weight:  # a GGUF matrix stays as it is stored
            w = state[name]
            return w.to(device=device, dtype=dtype) if isinstance(w, torch.Tensor) else w

        def get(name: str) -> torch.Tensor:
            w = mat(name)
            if not isinstance(w, torch.Tensor):
                raise ValueError(f"{name} must be a tensor")
            return w

        def maybe(name: str) -> torch.Tensor | None:
            return get(name) if name in state else None

        def cat(names: list[str]) -> Weight | None:
            parts = [mat(n) if n in state else None for n in names]
            if all(p is None for p in parts):
                return None
            if any(p is None for p in parts):
                raise ValueError(f"some but not all of {names} are in the checkpoint")
            quant = [p for p in parts if isinstance(p, QuantWeight)]
            if quant:
                if len(quant) != len(parts):
                    raise ValueError(f"{names} mix GGUF blocks and tensors")
                return stack(quant)
            return torch.cat([p for p in parts if isinstance(p, torch.Tensor)], dim=0).contiguous()

        def cat_bias(names: list[str]) -> torch.Tensor | None:
            b = cat(names)
            if b is not None and not isinstance(b, torch.Tensor):
                raise ValueError(f"{names} must be tensors")
            return b

        embed = mat("model.embed_tokens.weight")
        if not isinstance(embed, torch.Tensor | QuantWeight):
            raise ValueError("the embedding must be one matrix")
        self.embed: torch.Tensor | QuantWeight = embed
        self.norm = get("model.norm.weight")
        tied = config.tie_word_embeddings or "lm_head.weight" not in state
        self.lm_head: Weight = self.embed if tied else mat("lm_head.weight")
        h, kvh = config.num_heads, config.num_kv_heads
        self.layers: list[LayerWeights] = []
        for i in range(config.num_layers):
            p = f"model.layers.{i}."
            attn, mlp = p + "self_attn.", p + "mlp."
            qk_norm = None
            if config.qk_norm:
                qn, kn = get(attn + "q_norm.weight"), get(attn + "k_norm.weight")
                qk_norm = torch.cat([qn.expand(h, -1), kn.expand(kvh, -1)]).contiguous()
            qkv = cat([attn + f"{x}_proj.weight" for x in "qkv"])
            gate_up = cat([mlp + "gate_proj.weight", mlp + "up_proj.weight"])
            assert qkv is not None and gate_up is not None
            self.layers.append(
                LayerWeights(
                    input_norm=get(p + "input_layernorm.weight"),
                    qkv=qkv,
                    qkv_bias=cat_bias([attn + f"{x}_proj.bias" for x in "qkv"]),
                    qk_norm=qk_norm,
                    o=mat(attn + "o_proj.weight"),
                    o_bias=maybe(attn + "o_proj.bias"),
                    post_norm=get(p + "post_attention_layernorm.weight"),
                    gate_up=gate_up,
                    gate_up_bias=cat_bias([mlp + "gate_proj.bias", mlp + "up_proj.bias"]),
                    down=mat(mlp + "down_proj.weight"),
                    down_bias=maybe(mlp + "down_proj.bias"),
                )
            )
        self._fused: cpu_decode.DecodeLayers | None = None
        self._fused_checked = False

    def pack_weights(self) -> None:
        """Move the CPU weights into one huge-page arena in the order a forward reads them
        (``nj_kernels/weight_arena.py``): each layer's tensors, then the final norm and the
        output layer (the tied embedding). Weights of another type stay where they are."""
        slots: list[tuple[object, str]] = []
        for layer in self.layers:
            slots += [(layer, name) for name, t in vars(layer).items() if t is not None]
        slots += [(self, "norm"), (self, "lm_head"), (self, "embed")]
        unique: dict[int, torch.Tensor] = {}
        for owner, name in slots:
            t = getattr(owner, name)
            if type(t) is torch.Tensor and t.device.type == "cpu":
                unique.setdefault(id(t), t)
        packed = dict(zip(unique, weight_arena.pack(list(unique.values())), strict=True))
        for owner, name in slots:
            t = getattr(owner, name)
            setattr(owner, name, packed.get(id(t), t))
        self.weights_changed()

    def weights_changed(self) -> None:
        """Call after replacing weight tensors (elastic memory's moves): the fused path binds
        the tensors it was built on, so it is built again on the next forward."""
        self._fused, self._fused_checked = None, False

    def fused_layers(self) -> cpu_decode.DecodeLayers | None:
        """The layers bound for the fused C path, or None where it does not apply (not a CPU
        fp32 model, a weight it cannot read, no compiler). Its ``any_rows``: every matrix is
        GGUF blocks, so every forward of the model takes it (``run_layers``)."""
        if not self._fused_checked:
            self._fused_checked = True
            self._fused = None
            cfg = self.config
            layers = [vars(layer) for layer in self.layers]
            if (
                self.device.type == "cpu"
                and self.dtype == torch.float32
                and cpu_decode.available()
                and cfg.head_dim <= cpu_decode.MAX_HEAD_DIM
                and all(
                    cpu_decode.DecodeLayers.supports(t)
                    for layer in layers
                    for t in layer.values()
                    if t is not None
                )
            ):
                dims = cpu_decode.Dims(
                    cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size,
                    cfg.rms_norm_eps, self.scale,
                )  # fmt: skip
                self._fused = cpu_decode.DecodeLayers(dims, layers)
        return self._fused

    def weight_bytes(self) -> int:
        tensors: list[Weight] = [self.embed, self.norm]
        if self.lm_head is not self.embed:
            tensors.append(self.lm_head)
        for layer in self.layers:
            tensors += [t for t in vars(layer).values() if t is not None]
        return sum(t.nbytes for t in tensors)  # a QuantWeight's nbytes: its blocks

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        slots: torch.Tensor,  # [T] int64: cache slot of each row
        kv: torch.Tensor,  # [layers, 2, NB, BS, KVH, D]
        groups: list[AttentionGroup],
        logits_rows: torch.Tensor | None,  # rows whose logits are wanted; None: all
    ) -> torch.Tensor:
        hidden = self.run_layers(embedding(input_ids, self.embed), positions, slots, kv, groups)
        return self.logits(hidden, logits_rows)

    def run_layers(
        self,
        hidden: torch.Tensor,  # [T, hidden] input rows
        positions: torch.Tensor,
        slots: torch.Tensor,
        kv: torch.Tensor,
        groups: list[AttentionGroup],
    ) -> torch.Tensor:
        """Every decoder layer over the rows (writing their keys and values); the last layer's
        output, before the final norm. Few fp32 CPU rows take the fused C path; a model of GGUF
        blocks takes it for any number of rows (``cpu_decode``: one path, one rounding)."""
        limit = cpu_decode.max_rows()
        fused = self.fused_layers() if limit else None
        if fused is not None and (hidden.shape[0] <= limit or fused.any_rows) and positions.numel():
            cos, sin = self.rotary.table(int(positions.max()) + 1)
            return fused.run(hidden, positions, slots, kv, groups, cos, sin)
        cfg = self.config
        h, kvh, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        eps = cfg.rms_norm_eps
        t = hidden.shape[0]
        cos, sin = self.rotary.cos_sin(positions)
        attn_out = torch.empty(t, h, d, device=self.device, dtype=self.dtype)
        for i, layer in enumerate(self.layers):
            x = rms_norm(hidden, layer.input_norm, eps)
            qkv = linear(x, layer.qkv, layer.qkv_bias)
            qk = qkv[:, : (h + kvh) * d].view(t, h + kvh, d)
            v = qkv[:, (h + kvh) * d :].view(t, kvh, d)
            if layer.qk_norm is not None:
                qk = rms_norm(qk, layer.qk_norm, eps)
            qk = Rotary.apply(qk, cos, sin)
            q, k = qk[:, :h], qk[:, h:]
            write_kv(kv[i, 0], kv[i, 1], k, v, slots)
            for g in groups:
                rows = slice(g.row_start, g.row_start + g.num_rows)
                attn_out[rows] = group_attention(q[rows], kv[i], g, self.scale)
            hidden = hidden + linear(attn_out.view(t, h * d), layer.o, layer.o_bias)
            x = rms_norm(hidden, layer.post_norm, eps)
            gate, up = linear(x, layer.gate_up, layer.gate_up_bias).chunk(2, dim=-1)
            hidden = hidden + linear(F.silu(gate) * up, layer.down, layer.down_bias)
        return hidden

    def features(self, hidden: torch.Tensor) -> torch.Tensor:
        """The post-norm last-layer hidden states (what the LM head reads): a feature
        drafter's input."""
        return rms_norm(hidden, self.norm, self.config.rms_norm_eps)

    def logits(self, hidden: torch.Tensor, logits_rows: torch.Tensor | None) -> torch.Tensor:
        """The LM head over the wanted rows of ``run_layers``' output."""
        eps = self.config.rms_norm_eps
        if logits_rows is not None:
            hidden = hidden.index_select(0, logits_rows)
        n = hidden.shape[0]
        tensor_head = isinstance(self.lm_head, torch.Tensor)
        if 1 < n < MIN_GEMM_ROWS and not hidden.is_cuda and n > max_rows() and tensor_head:
            # Without the skinny kernel a 2- or 3-row product with the (wide) output layer
            # takes the slow path of the matrix library, slower than 4 rows: pad, then drop.
            hidden = torch.cat([hidden, hidden[-1:].expand(MIN_GEMM_ROWS - n, -1)])
        return linear(rms_norm(hidden, self.norm, eps), self.lm_head)[:n]
