"""The architecture facts our model runner needs, read from a Hugging Face config.

Supported: Llama-family decoders (``llama``, ``mistral``, ``qwen2``, ``qwen3``). Rotary settings
come either as transformers 5's ``rope_parameters`` or as the older ``rope_theta`` +
``rope_scaling`` pair; both normalise to one ``rope`` dict.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    rope: dict[str, Any] = field(default_factory=dict)  # rope_type, rope_theta, scaling keys
    qk_norm: bool = False  # Qwen3: RMSNorm over each head's q and k before rotary
    sliding_window: int | None = None  # when set, contexts are capped at the window
    eos_token_ids: tuple[int, ...] = ()
    torch_dtype: str | None = None

    @property
    def max_model_len(self) -> int:
        """Longest context we serve exactly: full attention equals sliding-window attention
        only while the context fits in the window."""
        if self.sliding_window:
            return min(self.max_position_embeddings, self.sliding_window)
        return self.max_position_embeddings

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ModelConfig:
        with open(Path(model_dir) / "config.json", encoding="utf-8") as f:
            return cls.from_dict(json.load(f))

    @classmethod
    def from_dict(cls, cfg: dict[str, Any]) -> ModelConfig:
        model_type = str(cfg.get("model_type", ""))
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"unsupported model_type {model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        if cfg.get("hidden_act", "silu") != "silu":
            raise ValueError(f"unsupported hidden_act {cfg.get('hidden_act')!r} (only silu)")
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        head_dim = int(cfg.get("head_dim") or hidden // heads)
        return cls(
            model_type=model_type,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=head_dim,
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            rope=_rope_params(cfg, head_dim),
            qk_norm=model_type == "qwen3",
            sliding_window=_sliding_window(cfg, model_type),
            eos_token_ids=_as_ids(cfg.get("eos_token_id")),
            torch_dtype=cfg.get("dtype") or cfg.get("torch_dtype"),
        )


def _rope_params(cfg: dict[str, Any], head_dim: int) -> dict[str, Any]:
    params = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    params.setdefault("rope_theta", float(cfg.get("rope_theta", 10000.0)))
    if "type" in params and "rope_type" not in params:  # transformers 4's spelling
        params["rope_type"] = params.pop("type")
    params.setdefault("rope_type", "default")
    if float(params.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ValueError("partial rotary embeddings are not supported")
    params["head_dim"] = head_dim
    return params


def _sliding_window(cfg: dict[str, Any], model_type: str) -> int | None:
    window = cfg.get("sliding_window")
    if not window:
        return None
    if model_type in ("qwen2", "qwen3") and not cfg.get("use_sliding_window", False):
        return None
    return int(window)


def _as_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, list | tuple):
        return tuple(int(v) for v in value)
    return (int(value),)
