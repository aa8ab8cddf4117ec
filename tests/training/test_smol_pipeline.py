"""`train-smol-drafters` end to end with a tiny stand-in teacher and tiny recipes."""

from pathlib import Path

import pytest
import torch
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from tests.training.conftest import DATA
from training import smol_drafters, smol_pipeline
from training.checkpoint import read_meta, save_model
from training.generate import generate_labelled
from training.smol_drafters import load_teacher
from training.smol_pipeline import SmolOptions, run_smol, sequence_agreement
from training.specs import ArchSpec, Recipe


def _teacher_dir(tok: PreTrainedTokenizerFast, path: Path) -> Path:
    torch.manual_seed(0)
    model = LlamaForCausalLM(ArchSpec(32, 1, 4, 2, 64).llama_config(len(tok), 0))
    # Its metadata file marks the export complete, so no real SmolLM2 download is attempted.
    return save_model(model, tok, path, {"name": "stand-in"})


def test_a_drafter_agrees_with_itself(tiny_tokenizer: PreTrainedTokenizerFast, tmp_path: Path) -> None:
    teacher = load_teacher(_teacher_dir(tiny_tokenizer, tmp_path / "t"))
    seqs = generate_labelled(teacher.model, [[5, 6, 7], [8, 9]], 9, 1, eos_id=None, pad_id=0)
    assert sequence_agreement(teacher.model, seqs) == (1.0, 1.0, 4.0)


@pytest.mark.train
def test_train_smol_drafters_end_to_end(tiny_tokenizer: PreTrainedTokenizerFast, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    arch = ArchSpec(16, 1, 2, 1, 32)
    recipes = tuple(Recipe(name=f"smol-draft-{d}", arch=arch, domains=(d,), steps=6, batch_size=2, seq_len=32,
                           warmup=2, topk=4, continuations=3, max_windows=8) for d in ("chat", "code"))
    monkeypatch.setattr(smol_pipeline, "SMOL_DRAFTERS", recipes)
    monkeypatch.setattr(smol_pipeline, "NEW_TOKENS", 8)
    monkeypatch.setattr(smol_pipeline, "EVAL_PROMPTS", 2)
    monkeypatch.setattr(smol_pipeline, "EVAL_NEW_TOKENS", 8)
    monkeypatch.setattr(smol_pipeline, "EVAL_WINDOWS", 2)
    monkeypatch.setattr(smol_drafters, "CACHE_DIR", tmp_path / "cache")
    teacher_dir = _teacher_dir(tiny_tokenizer, tmp_path / "teacher")
    logs: list[str] = []
    opts = SmolOptions(out=tmp_path / "models", data=DATA, teacher_dir=teacher_dir, threads=1)
    run_smol(opts, log=logs.append)
    # The teacher export is reused, not redone: at most the GGUF file is placed beside it.
    assert str(teacher_dir) in logs[0] and not any("exporting SmolLM2" in line for line in logs), logs
    for d in ("chat", "code"):
        meta = read_meta(tmp_path / "models" / f"smol-draft-{d}")
        assert meta["steps"] == 6 and meta["teacher_continuations"] == 3
        assert meta["command"].startswith("nightjar models train-smol-drafters")
        assert set(meta["eval"]["agreement_continuation"]) == {"chat", "sharegpt", "code"}
        assert set(meta["eval"]["val_loss"]) == {"chat", "code"}
    report = (tmp_path / "MODELS.md").read_text()
    assert "| `smol-draft-chat` | sharegpt |" in report
