"""Saving and loading the Hugging Face model directories, plus their training metadata."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from training.tokenizer import save_tokenizer

META_FILE = "nightjar_meta.json"
# Files a previous save may have left; cleared first so a directory never mixes two runs.
_OWNED_FILES = (
    "config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
    "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", META_FILE,
)


def save_model(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out_dir: str | Path,
               meta: dict[str, Any]) -> Path:
    """Writes a complete HF directory with bfloat16 weights (half the bytes of fp32)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name in _OWNED_FILES:
        (out / name).unlink(missing_ok=True)
    half = copy.deepcopy(model).bfloat16()
    half.config.dtype = "bfloat16"
    cfg = model.config
    half.generation_config = GenerationConfig(
        bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id, pad_token_id=cfg.pad_token_id,
        do_sample=False,
    )
    half.save_pretrained(str(out))
    save_tokenizer(tokenizer, out)
    write_meta(out, meta)
    return out


def load_model(model_dir: str | Path, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """Loads a saved directory, upcast to ``dtype`` (fp32: bf16 is slow and erratic on this CPU)."""
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype)
    model.eval()
    return model


def load_tokenizer(model_dir: str | Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(str(model_dir))


def read_meta(model_dir: str | Path) -> dict[str, Any]:
    path = Path(model_dir) / META_FILE
    if not path.is_file():
        return {}
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def write_meta(model_dir: str | Path, meta: dict[str, Any]) -> None:
    (Path(model_dir) / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")


def dir_bytes(model_dir: str | Path) -> int:
    return sum(p.stat().st_size for p in Path(model_dir).iterdir() if p.is_file())


def count_params(model: torch.nn.Module) -> int:
    """Unique parameters: a tied embedding/output matrix counts once."""
    return sum(p.numel() for p in model.parameters())
