"""The feature drafter's model: one decoder layer over ``fc([feature; embed(token)])`` rows
(see ``feature_drafter.py`` for the drafter that feeds it), its runner and its loading.

The embedding and output rows are the target's tensors (referenced, not copied, for the
embedding; the output rows are gathered once). ``FeatureModel`` keeps the DecoderModel weight
attributes, so elastic memory moves ``fc``, the layer, the norm and the head rows like any
drafter's weights (``weight_slots``), never the target's embedding.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from nj_kernels.cpu_linear import embedding, linear
from nj_kernels.quant_linear import QuantWeight, Weight
from worker.engine.attention import AttentionGroup
from worker.engine.kv_cache import KVCache
from worker.engine.model import DecoderModel
from worker.engine.model_config import ModelConfig
from worker.engine.model_runner import ModelRunner
from worker.engine.weights import load_checkpoint

CONFIG_KEY = "nightjar_feature_drafter"


def is_feature_drafter(path: str | Path) -> bool:
    cfg = Path(path) / "config.json"
    return cfg.is_file() and CONFIG_KEY in json.loads(cfg.read_text(encoding="utf-8"))


def rows_of(w: torch.Tensor | QuantWeight, ids: torch.Tensor) -> torch.Tensor:
    """Rows ``ids`` of the target's output layer as a tensor (a GGUF one dequantised, exactly)."""
    return w[ids.to(w.device)] if isinstance(w, torch.Tensor) else w.embedding(ids)


class FeatureModel(DecoderModel):
    """One (or more) decoder layers whose input rows are ``fc([feature; embed(token)])``.

    ``forward``'s ``input_ids`` index a table bound by ``bind`` (features and next tokens), so
    the generic ``ModelRunner`` lays the batch out unchanged. It returns, per wanted row, the
    logits over the drafter's vocabulary and the output feature side by side: ``[R, K + H]``.
    """

    def __init__(
        self,
        config: ModelConfig,
        state: dict[str, torch.Tensor],
        target_embed: torch.Tensor | QuantWeight,
        target_head: Weight,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        ids = state["vocab_ids"].long()
        if not isinstance(target_head, torch.Tensor | QuantWeight):
            raise ValueError("a feature drafter needs the target's output layer as one matrix")
        full: dict[str, Weight] = dict(state)
        full["model.embed_tokens.weight"] = target_embed
        full["lm_head.weight"] = rows_of(target_head, ids)
        super().__init__(config, full, device, dtype)
        self.token_embed = self.embed  # the target's own tensor (``get`` keeps it as it is)
        self.fc = state["fc.weight"].to(device=device, dtype=dtype)
        self.vocab_ids = ids.to(device)
        self._feats = torch.empty(0, config.hidden_size, device=device, dtype=dtype)
        self._tokens = torch.empty(0, dtype=torch.long, device=device)

    def weight_slots(self) -> list[tuple[object, str]]:
        slots: list[tuple[object, str]] = [(self, "fc"), (self, "norm"), (self, "lm_head")]
        for layer in self.layers:
            slots += [(layer, name) for name, t in vars(layer).items() if t is not None]
        return slots

    def weight_bytes(self) -> int:
        seen = {id(getattr(o, a)): getattr(o, a) for o, a in self.weight_slots()}
        return sum(t.numel() * t.element_size() for t in seen.values())

    def bind(self, feats: torch.Tensor, tokens: torch.Tensor) -> None:
        self._feats, self._tokens = feats.to(self.dtype), tokens

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        kv: torch.Tensor,
        groups: list[AttentionGroup],
        logits_rows: torch.Tensor | None,
    ) -> torch.Tensor:
        x_in = torch.cat([self._feats[input_ids], embedding(self._tokens[input_ids], self.token_embed)], -1)
        hidden = self.run_layers(linear(x_in.to(self.dtype), self.fc), positions, slots, kv, groups)
        if logits_rows is not None:
            hidden = hidden.index_select(0, logits_rows)
        out = self.features(hidden)
        return torch.cat([linear(out, self.lm_head), out], dim=-1)


class FeatureRunner(ModelRunner):
    """A ``ModelRunner`` (layout, paged KV) over a ``FeatureModel``."""

    model: FeatureModel

    def __init__(
        self,
        config: ModelConfig,
        state: dict[str, torch.Tensor],
        target: DecoderModel,
        block_size: int,
        num_blocks: int = 2,
    ) -> None:
        self.config, self.block_size = config, block_size
        self.device, self.dtype = target.device, target.dtype
        self.model = FeatureModel(config, state, target.embed, target.lm_head, self.device, self.dtype)
        self.weight_bytes = self.model.weight_bytes()
        self.cache = KVCache(config, num_blocks, block_size, self.device, self.dtype)
        self.group_size = config.num_heads // config.num_kv_heads


def load_feature_runner(path: str | Path, target: ModelRunner, block_size: int) -> FeatureRunner:
    config, loaded = load_checkpoint(Path(path), None)
    state = {k: v for k, v in loaded.items() if isinstance(v, torch.Tensor)}
    if len(state) != len(loaded):
        raise ValueError(f"feature drafter {Path(path).name}: its weights must be tensors (safetensors)")
    if config.hidden_size != target.config.hidden_size or config.vocab_size != target.config.vocab_size:
        raise ValueError(
            f"feature drafter {Path(path).name} is for a target of width {config.hidden_size} and vocabulary "
            f"{config.vocab_size}, not {target.config.hidden_size} / {target.config.vocab_size}"
        )
    return FeatureRunner(config, state, target.model, block_size)
