"""A seconds-scale version of `train`: a tiny target and a tiny distilled drafter."""

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from tests.training.conftest import TINY_TEXT
from training.batches import encode_documents
from training.checkpoint import load_model, read_meta, save_model
from training.pipeline import train_drafter, train_target
from training.specs import Recipe
from training.trainer import LoopConfig


def _streams(tok: PreTrainedTokenizerFast) -> dict[str, torch.Tensor]:
    return {
        "stories": encode_documents(tok, [TINY_TEXT[0], TINY_TEXT[1]] * 6, 0),
        "code": encode_documents(tok, [TINY_TEXT[2]] * 6, 0),
    }


def _cfg(recipe: Recipe) -> LoopConfig:
    return LoopConfig(steps=recipe.steps, lr=recipe.lr, warmup=recipe.warmup, log_every=10)


@pytest.mark.train
def test_mini_target_learns_and_saves_a_loadable_hf_dir(
    tiny_tokenizer: PreTrainedTokenizerFast, tiny_target: Recipe, tmp_path: Path
) -> None:
    model, run = train_target(tiny_tokenizer, _streams(tiny_tokenizer), tiny_target, _cfg(tiny_target), 0,
                              log=lambda _: None)
    assert run.steps == 40 and run.tokens == 40 * 8 * 32
    assert run.last_loss < 0.6 * run.first_loss
    out = save_model(model, tiny_tokenizer, tmp_path / "nj-target", {"name": "nj-target"})
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
            "tokenizer_config.json"} <= names
    assert read_meta(out) == {"name": "nj-target"}

    loaded = AutoModelForCausalLM.from_pretrained(str(out))
    assert loaded.config.num_key_value_heads < loaded.config.num_attention_heads  # GQA
    assert next(loaded.parameters()).dtype == torch.bfloat16  # the files hold bf16
    tok = AutoTokenizer.from_pretrained(str(out))
    assert tok.eos_token_id == loaded.config.eos_token_id == 0
    ids = torch.tensor([tok("Once upon a time")["input_ids"]])
    with torch.no_grad():
        want = model(input_ids=ids).logits
        got = load_model(out)(input_ids=ids).logits  # fp32 upcast of the bf16 weights
    assert torch.allclose(got, want, atol=0.1)


@pytest.mark.train
def test_same_seed_same_target(tiny_tokenizer: PreTrainedTokenizerFast, tiny_target: Recipe) -> None:
    streams = _streams(tiny_tokenizer)
    short = LoopConfig(steps=5, lr=tiny_target.lr, warmup=2)
    a, _ = train_target(tiny_tokenizer, streams, tiny_target, short, 7, log=lambda _: None)
    b, _ = train_target(tiny_tokenizer, streams, tiny_target, short, 7, log=lambda _: None)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)


@pytest.mark.train
def test_drafter_distils_towards_the_target(
    tiny_tokenizer: PreTrainedTokenizerFast, tiny_target: Recipe, tiny_drafter: Recipe
) -> None:
    streams = _streams(tiny_tokenizer)
    target, _ = train_target(tiny_tokenizer, streams, tiny_target, _cfg(tiny_target), 0, log=lambda _: None)
    drafter, run, info = train_drafter(target, tiny_tokenizer, streams, tiny_drafter, _cfg(tiny_drafter), 1,
                                       log=lambda _: None)
    assert run.last_loss < run.first_loss  # the KL to the target's soft labels fell
    assert info["teacher_continuations"] == 4
    assert info["distill_windows"] == 8 + 4  # capped text windows plus continuations
    assert sum(p.numel() for p in drafter.parameters()) < sum(p.numel() for p in target.parameters())
