"""Read a checkpoint directory into a ModelConfig and a state dict with Hugging Face names.

Formats: ``model.safetensors``; sharded safetensors with ``model.safetensors.index.json``;
GGUF (dequantised by transformers' own GGUF loader, which needs the ``gguf`` package).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from worker.engine.model_config import ModelConfig


def find_gguf(model_dir: str | Path) -> str | None:
    """The directory's GGUF file name, when it holds no safetensors; None otherwise."""
    path = Path(model_dir)
    if any(path.glob("*.safetensors")):
        return None
    ggufs = sorted(p.name for p in path.glob("*.gguf"))
    if len(ggufs) > 1:
        raise ValueError(f"{path} holds several GGUF files ({', '.join(ggufs)}); pass gguf_file=")
    return ggufs[0] if ggufs else None


def load_checkpoint(
    model_dir: str | Path, gguf_file: str | None = None
) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    path = Path(model_dir)
    gguf_file = gguf_file or find_gguf(path)
    if gguf_file is not None:
        return _load_gguf(path, gguf_file)
    state = _load_safetensors(path)
    return ModelConfig.from_dir(path), state


def _load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    index = path / "model.safetensors.index.json"
    if index.exists():
        with open(index, encoding="utf-8") as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    elif (path / "model.safetensors").exists():
        files = ["model.safetensors"]
    else:
        raise FileNotFoundError(f"no model.safetensors, shard index or GGUF file in {path}")
    state: dict[str, torch.Tensor] = {}
    for name in files:
        state.update(load_file(str(path / name)))
    return state


def _load_gguf(path: Path, gguf_file: str) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), gguf_file=gguf_file, dtype=torch.float32)
    config = ModelConfig.from_dict(model.config.to_dict())
    state = {k: v.detach() for k, v in model.state_dict().items()}
    return config, state
