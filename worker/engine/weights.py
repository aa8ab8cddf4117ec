"""Read a checkpoint directory into a ModelConfig and a state dict with Hugging Face names.

Formats: ``model.safetensors``; sharded safetensors with ``model.safetensors.index.json``;
GGUF, either kept as it is stored (``native``: ``gguf_weights.load_gguf_native``, matrices as
``QuantWeight`` blocks) or dequantised to fp32 by transformers' own GGUF loader. Both need the
``gguf`` package. A directory may hold a GGUF file beside a safetensors export of the same
model (``nightjar models smollm2`` makes one): ``weights_for`` says which is served.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from nj_kernels import quant_linear
from nj_kernels.quant_linear import Weight
from worker.engine.model_config import ModelConfig


def gguf_files(model_dir: str | Path) -> list[str]:
    return sorted(p.name for p in Path(model_dir).glob("*.gguf"))


def has_safetensors(model_dir: str | Path) -> bool:
    return any(Path(model_dir).glob("*.safetensors"))


def find_gguf(model_dir: str | Path) -> str | None:
    """The directory's GGUF file name, when it holds no safetensors; None otherwise (the file
    transformers' loader would dequantise)."""
    return None if has_safetensors(model_dir) else _one_gguf(Path(model_dir))


def _one_gguf(path: Path) -> str | None:
    ggufs = gguf_files(path)
    if len(ggufs) > 1:
        raise ValueError(f"{path} holds several GGUF files ({', '.join(ggufs)}); pass gguf_file=")
    return ggufs[0] if ggufs else None


@dataclass(frozen=True)
class WeightsChoice:
    """What ``load_checkpoint`` reads: ``gguf_file`` (None: safetensors), and whether its
    matrices stay in their encoding (``native``) or are dequantised to fp32."""

    gguf_file: str | None
    native: bool


def weights_for(
    model_dir: str | Path, gguf_file: str | None = None, dtype: str | None = None, device: str = "cpu"
) -> WeightsChoice:
    """A directory with a GGUF file is served from its blocks on CPU unless a dtype is asked
    for (``--dtype fp32``: the safetensors beside it, else the GGUF dequantised, as before) or
    the block kernel cannot be built here."""
    path = Path(model_dir)
    name = gguf_file or _one_gguf(path)
    if name is not None and dtype is None and device == "cpu" and quant_linear.available():
        return WeightsChoice(name, True)
    if gguf_file is None and has_safetensors(path):
        return WeightsChoice(None, False)
    return WeightsChoice(name, False)


def load_checkpoint(
    model_dir: str | Path, gguf_file: str | None = None, native: bool = False
) -> tuple[ModelConfig, Mapping[str, Weight]]:
    """``native``: the GGUF file (``gguf_file`` or the directory's one) kept as it is stored.
    Otherwise ``gguf_file`` (or a directory holding only a GGUF) is dequantised to fp32, and
    safetensors are read as they are."""
    path = Path(model_dir)
    if native:
        from worker.engine.gguf_weights import load_gguf_native

        name = gguf_file or _one_gguf(path)
        if name is None:
            raise FileNotFoundError(f"no GGUF file in {path}")
        return load_gguf_native(path / name)
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
